"""One spec per BPF object: everything user space needs to know about a built
``.bpf.o``, read from its ELF once and cached beside it.

The spec holds the object's BTF types (record layouts, kernel types it names,
globals), its programs (name -> section) and its global variables (section,
offset, size, from the symbol table). It is derived by one pass over the ELF and
stored as ``<object>.spec.json`` next to the object, keyed by the object's
SHA-256, when the object is built (``kernmlops build-bpf``) or, failing that, on
first use. Loading then reads the JSON (a millisecond) instead of the ELF
(pyelftools: tens of milliseconds to import, milliseconds per object), and the
object itself is parsed once more only by libbpf, to load it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.ebpf.btf import Btf, BtfError, BtfType, Kind, btf_ring_layouts
from kernmlops.ebpf.buildfolder import check_build_dir
from kernmlops.fileio import write_atomic

if TYPE_CHECKING:
    from kernmlops.ebpf.btf import RecordLayout

#: Bumped when the cached JSON changes shape; an old cache is then rebuilt.
FORMAT = 1
SUFFIX = ".spec.json"
#: Program-name suffix of each variant, in order of preference (see ebpf.objects).
VARIANTS: tuple[str, ...] = ("btf", "raw")


def program_variant(name: str) -> str | None:
    """The variant a program belongs to, by its name's suffix; None: every variant's."""
    suffix = name.rsplit("_", 1)[-1]
    return suffix if suffix in VARIANTS else None


@dataclass(frozen=True)
class GlobalVar:
    """A global variable: the ELF section it lives in and where."""

    section: str
    offset: int
    size: int


@dataclass
class ObjectSpec:
    """What a compiled BPF object declares, without loading it."""

    path: Path
    sha256: str
    #: program (function) name -> ELF section (e.g. "tp_btf/sched_switch")
    programs: dict[str, str]
    #: global variable -> where it lives (.rodata for const volatile settings)
    globals: dict[str, GlobalVar]
    btf: Btf
    _layouts: dict[str, RecordLayout] | None = field(default=None, repr=False)

    @property
    def has_variants(self) -> bool:
        """Whether some program belongs to a variant (name ends in _btf or _raw)."""
        return any(program_variant(name) for name in self.programs)

    def ring_layouts(self) -> dict[str, RecordLayout]:
        """Layouts of every ring declared with KMO_RING (numpy dtypes, built once)."""
        if self._layouts is None:
            self._layouts = btf_ring_layouts(self.btf)
        return self._layouts

    # -- the cache file --------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "sha256": self.sha256,
            "programs": self.programs,
            "globals": {n: [g.section, g.offset, g.size] for n, g in self.globals.items()},
            "types": [_type_row(t) for t in self.btf.types[1:]],
        }

    @classmethod
    def from_json(cls, path: Path, data: dict[str, Any]) -> ObjectSpec:
        types = [BtfType(0, Kind.VOID, "")]
        for i, row in enumerate(data["types"], start=1):
            types.append(_type_from_row(i, row))
        return cls(
            path=path,
            sha256=data["sha256"],
            programs=dict(data["programs"]),
            globals={n: GlobalVar(*g) for n, g in data["globals"].items()},
            btf=Btf(types),
        )


def _type_row(t: BtfType) -> list[Any]:
    return [int(t.kind), t.name, t.size, t.ref, t.nelems, t.encoding, t.bits, t.members]


def _type_from_row(type_id: int, row: list[Any]) -> BtfType:
    kind, name, size, ref, nelems, encoding, bits, members = row
    return BtfType(
        type_id,
        Kind(kind),
        name,
        size=size,
        ref=ref,
        nelems=nelems,
        encoding=encoding,
        bits=bits,
        members=[tuple(m) for m in members],
    )


def spec_path(obj: Path) -> Path:
    """Where the spec of ``obj`` is cached."""
    return obj.with_name(obj.name + SUFFIX)


def digest(obj: Path) -> str:
    try:
        return hashlib.sha256(obj.read_bytes()).hexdigest()
    except OSError as err:
        raise BtfError(f"cannot read {obj}: {err.strerror}") from err


def parse_object(obj: Path, sha256: str | None = None) -> ObjectSpec:
    """The spec of ``obj`` from its ELF (one pass: .BTF, .symtab, section names)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    sha = sha256 or digest(obj)
    programs: dict[str, str] = {}
    globals_: dict[str, GlobalVar] = {}
    try:
        with obj.open("rb") as fh:
            elf = ELFFile(fh)
            section = elf.get_section_by_name(".BTF")
            if section is None:
                raise BtfError(f"{obj}: no .BTF section (compile with clang -g)")
            btf = Btf.parse(section.data())
            symtab = elf.get_section_by_name(".symtab")
            for sym in symtab.iter_symbols() if symtab is not None else ():
                kind = sym["st_info"]["type"]
                if not isinstance(sym["st_shndx"], int):
                    continue
                where = elf.get_section(sym["st_shndx"]).name
                if kind == "STT_OBJECT":
                    globals_[sym.name] = GlobalVar(where, sym["st_value"], sym["st_size"])
                elif kind == "STT_FUNC" and where != ".text":
                    programs[sym.name] = where  # libbpf's rule: a function outside .text
    except OSError as err:
        raise BtfError(f"cannot read {obj}: {err.strerror}") from err
    except ELFError as err:
        raise BtfError(f"{obj} is not an ELF object: {err}") from err
    return ObjectSpec(obj, sha, programs, globals_, btf)


_cache: dict[Path, ObjectSpec] = {}
_lock = threading.Lock()


def object_spec(obj: str | Path, *, write: bool = True) -> ObjectSpec:
    """The spec of a built object: from memory, else the cached JSON beside it
    (when its SHA-256 matches), else the ELF (then cached, if ``write`` and the
    folder is writable). One parse per object per process at most. As root, an object
    in a folder another user can change is neither parsed nor cached there
    (:func:`~kernmlops.ebpf.buildfolder.check_build_dir`: UnsafeBuildFolder)."""
    obj = Path(obj)
    check_build_dir(obj.parent)
    sha = digest(obj)
    with _lock:
        hit = _cache.get(obj)
        if hit is not None and hit.sha256 == sha:
            return hit
    spec = _read_cached(obj, sha)
    if spec is None:
        spec = parse_object(obj, sha)
        if write:
            save_spec(spec)
    with _lock:
        _cache[obj] = spec
    return spec


def ring_layouts(path: str | Path) -> dict[str, RecordLayout]:
    """Layouts of every ring buffer declared in a compiled object (its cached spec)."""
    return object_spec(path).ring_layouts()


def _read_cached(obj: Path, sha: str) -> ObjectSpec | None:
    try:
        data = json.loads(spec_path(obj).read_text())
        if data.get("format") != FORMAT or data.get("sha256") != sha:
            return None
        return ObjectSpec.from_json(obj, data)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, stale or damaged: derive it again


def save_spec(spec: ObjectSpec) -> bool:
    """Write the spec beside its object (temp file, then rename); False when the
    folder is not writable (a user reading root's build folder): nothing is lost
    but the time to parse it next time."""
    try:
        write_atomic(spec_path(spec.path), json.dumps(spec.to_json(), separators=(",", ":")))
    except OSError:
        return False
    return True
