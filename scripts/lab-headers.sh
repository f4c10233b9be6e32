#!/usr/bin/env bash
# The linux-headers package matching the installed linux-image-amd64 exactly
# (the kernel the lab boots): linux-image-amd64 depends on
# linux-image-<abi> (= <version>), the headers are linux-headers-<abi>.
set -euo pipefail
dep=$(dpkg-query -W -f='${Depends}' linux-image-amd64)
abi=$(sed -n 's/^linux-image-\([^ ,]*\) (= .*/\1/p' <<<"$dep")
if [[ -z "$abi" ]]; then
  echo "error: cannot tell the lab kernel from linux-image-amd64's dependency: $dep" >&2
  exit 1
fi
echo "linux-headers-$abi"
