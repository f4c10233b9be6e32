/* SPDX-License-Identifier: GPL-2.0 */
/* libbpf's bpf_core_read.h as libbpf 1.4 and later give it: with bpf_helpers.h
 * (SEC, __always_inline, __kconfig). ebpf_exporter builds its examples against
 * libbpf 1.5, and some (biolatency, raw-tracepoints) include only this header
 * for those; Debian 12's libbpf 1.1 does not include bpf_helpers.h here. Only
 * ebpf_exporter-style programs see this folder (exporter/compat.py). */
#ifndef KMO_EE_BPF_CORE_READ_H
#define KMO_EE_BPF_CORE_READ_H

#include <bpf/bpf_helpers.h>
#include_next <bpf/bpf_core_read.h>

#endif
