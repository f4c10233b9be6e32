"""ebpf_exporter's config format without the kernel: telling the formats
apart, its label layout (padding after a label), its histograms (bucket in
the last key field), its decoders' answers, its flags' helpers."""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.compat import (
    BucketKeyHistogram,
    EeCounterSpec,
    EeHistogramSpec,
    go_float,
    is_ebpf_exporter_config,
    kaddr_globals,
    resolve_config_dir,
)
from kernmlops.exporter.config import (
    EBPF_EXPORTER_FORMAT,
    DecoderSpec,
    LabelSpec,
    MetricSetError,
    load_metric_set,
)
from kernmlops.exporter.decoders import (
    DecoderContext,
    DropLabelSet,
    Kallsyms,
    PciIds,
    build_decoder,
    dname,
    inet_ip,
    label_decoders,
)
from kernmlops.exporter.perf_event_array import go_duration_s

CONFIGS = Path(__file__).parent / "ebpf_exporter"
#: ebpf_exporter's oomkill counter's form: a perf event array, one u64 label
PERF = {
    "name": "oom_kills_total",
    "help": "h",
    "perf_event_array": True,
    "labels": [{"name": "cgroup_path", "size": 8, "decoders": [{"name": "uint"}]}],
}
COUNTED = {"metrics": {"counters": [{"name": "a", "help": "h"}]}}


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


HIST = {
    "name": "disk_latency_seconds",
    "help": "latency",
    "bucket_type": "exp2",
    "bucket_min": 0,
    "bucket_max": 3,
    "bucket_multiplier": 0.001,
    "labels": [
        {"name": "dev", "size": 4, "decoders": [{"name": "uint"}]},
        {"name": "op", "size": 1, "padding": 3, "decoders": [{"name": "uint"}]},
        {"name": "bucket", "size": 8, "decoders": [{"name": "uint"}]},
    ],
}


def test_formats_told_apart() -> None:
    theirs = load_metric_set(CONFIGS / "write-sizes.yaml")
    assert theirs.format == EBPF_EXPORTER_FORMAT
    assert theirs.name == "write-sizes"  # the file's name, as ebpf_exporter names configs
    assert "-mcpu=v3" in theirs.cflags
    ours = load_metric_set(Path(__file__).parents[2] / "src/kernmlops/bpf/exp_runqlat.yaml")
    assert ours.format == "kernmlops"
    assert not is_ebpf_exporter_config({"description": "x", "metrics": {"counters": [{}]}})
    assert not is_ebpf_exporter_config({"metrics": {"counters": [{"name": "a", "map": "b"}]}})
    assert is_ebpf_exporter_config({"metrics": {"counters": [{"name": "a", "help": "h"}]}})


def test_padding_follows_its_label(tmp_path: Path) -> None:
    """ebpf_exporter's padding comes after its label (ours before): the op
    byte's 3 bytes of padding put the bucket at offset 8."""
    ms = load_metric_set(write(tmp_path, "disk", {"metrics": {"histograms": [HIST]}}))
    (spec,) = ms.metrics
    assert isinstance(spec, EeHistogramSpec)
    assert spec.name == "ebpf_exporter_disk_latency_seconds" and spec.map == "disk_latency_seconds"
    assert [(label.name, label.padding) for label in spec.labels] == [("dev", 0), ("op", 0)]
    assert spec.bucket_label.padding == 3
    assert spec.total_key_bytes == 16


class FakeReader:
    def __init__(self, rows: dict[bytes, int]) -> None:
        self.rows = rows

    def read(self) -> tuple[list[bytes], np.ndarray]:
        keys = list(self.rows)
        return keys, np.array([[self.rows[k]] for k in keys], dtype=np.uint64).reshape(-1, 1)


def hkey(dev: int, op: int, bucket: int) -> bytes:
    return struct.pack("<IB3xQ", dev, op, bucket)


def test_bucket_key_histogram(tmp_path: Path) -> None:
    """Cumulative buckets bucket_min..bucket_max, +Inf = the last bucket's count,
    the sum from bucket_max + 1; keys outside the range are not shown."""
    ms = load_metric_set(write(tmp_path, "disk", {"metrics": {"histograms": [HIST]}}))
    (spec,) = ms.metrics
    rows = {hkey(8, 1, 0): 2, hkey(8, 1, 2): 5, hkey(8, 1, 3): 1, hkey(8, 1, 4): 900}
    rows |= {hkey(8, 1, 9): 77, hkey(259, 0, 1): 4}  # bucket 9: beyond the sum key
    metric = BucketKeyHistogram("disk", spec, FakeReader(rows), DecoderContext(), 100)
    out: list[str] = []
    metric.text(metric.snapshot(), out)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families("".join(out))
        for s in family.samples
    }
    name = "ebpf_exporter_disk_latency_seconds"
    labels = (("dev", "8"), ("op", "1"))
    want = {"0.001": 2, "0.002": 2, "0.004": 7, "0.008": 8, "+Inf": 8}
    for le, count in want.items():
        assert got[(f"{name}_bucket", tuple(sorted((*labels, ("le", le)))))] == count
    assert got[(f"{name}_count", labels)] == 8
    assert got[(f"{name}_sum", labels)] == pytest.approx(0.9)
    assert got[(f"{name}_bucket", (("dev", "259"), ("le", "0.002"), ("op", "0")))] == 4
    assert 'le="0.001"' in "".join(out)  # Go's form of the bound


def test_go_float_as_go_writes_it() -> None:
    # strconv.FormatFloat(v, 'g', -1, 64), as the Prometheus Go client writes le
    cases = {1.0: "1", 1024.0: "1024", 0.0: "0", 1e-06: "1e-06", 1048576.0: "1.048576e+06"}
    cases |= {0.0001: "0.0001", 2.5e-05: "2.5e-05", 999999.0: "999999", 1e6: "1e+06"}
    cases |= {67.108864: "67.108864", 0.5: "0.5", float("inf"): "+Inf"}
    assert {v: go_float(v) for v in cases} == cases


def test_perf_event_array_and_cgroup_id_map_are_read(tmp_path: Path) -> None:
    """ebpf_exporter's oomkill-like counter and a cgroup id map load as written;
    flush_interval is a Go duration (a string, or nanoseconds), an hour by default."""
    data = {
        "metrics": {"counters": [PERF, {**PERF, "name": "b", "flush_interval": "1m30s"}]},
        "cgroup_id_map": {"name": "ids", "type": "", "regexps": ["^.*(system.slice/.*)$"]},
    }
    ms = load_metric_set(write(tmp_path, "oom", data))
    first, second = ms.metrics
    assert isinstance(first, EeCounterSpec) and first.perf_event_array
    assert (first.flush_interval_s, second.flush_interval_s) == (3600.0, 90.0)
    assert first.total_key_bytes == 8
    assert ms.cgroup_id_map.type == "hash"  # empty: hash, as there
    (pattern,) = ms.cgroup_id_map.patterns()
    assert pattern.search("/sys/fs/cgroup/system.slice/cron.service")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("250ms", 0.25), ("2us", 2e-6),
     ("0", 0.0), ("-1s", -1.0), (5_000_000_000, 5.0)],
)  # fmt: skip
def test_go_durations(value: object, seconds: float) -> None:
    assert go_duration_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "1", "1d", "s", "1h 2m", True, 1.5, None])
def test_not_go_durations(value: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        go_duration_s(value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"metrics": {"counters": [{**PERF, "flush_interval": "an hour"}]}},
         "flush_interval: 'an hour' is not a duration (e.g. 30s, 5m, 1h)"),
        ({**COUNTED, "cgroup_id_map": {"name": "ids", "type": "lru_hash"}},
         "cgroup_id_map.type: 'lru_hash' is not one of hash, cgrp_storage"),
        ({**COUNTED, "cgroup_id_map": {"name": "ids", "regexps": ["^(unclosed"]}},
         "regexps[0] '^(unclosed' is not a valid regexp"),
        ({**COUNTED, "cgroup_id_map": {"type": "hash", "regexps": []}},
         "cgroup_id_map.name"),
        ({**COUNTED, "cgroup_id_map": {"name": "ids", "regexp": ["x"]}},
         "did you mean 'regexps'"),
        ({"metrics": {"counters": [{"name": "a", "help": "h"}]}, "tracing": {"spans": [{}]}},
         "tracing.spans[0].ringbuf: Field required"),
        ({"metrics": {"counters": [{"name": "a", "hlep": "h"}]}}, "did you mean 'help'"),
        ({"metrics": {"histograms": [{**HIST, "bucket_type": "exp3"}]}}, "bucket_type"),
        ({"metrics": {"histograms": [{**HIST, "labels": []}]}}, "last label is the bucket"),
        ({"metrics": {"counters": [{"name": "a b", "help": "h"}]}},
         "metrics.counters[0] (a b).name: 'ebpf_exporter_a b' is not a Prometheus metric name"),
    ],
)  # fmt: skip
def test_bad_configs_get_one_clear_error(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(MetricSetError) as err:
        load_metric_set(write(tmp_path, "bad", data))
    assert message in str(err.value), str(err.value)
    assert "ebpf_exporter" in str(err.value)
    assert "Traceback" not in str(err.value)
    # one problem is one line, as every other error (the name's was a header and a line);
    # a list only for more than one
    assert len(str(err.value).splitlines()) != 2, str(err.value)


def test_config_dir_and_names(tmp_path: Path) -> None:
    paths = resolve_config_dir(str(CONFIGS), "write-sizes,cpu-clock")
    assert paths == [str(CONFIGS / "write-sizes.yaml"), str(CONFIGS / "cpu-clock.yaml")]
    with pytest.raises(MetricSetError, match=r"no .*nope\.yaml .*cpu-clock"):
        resolve_config_dir(str(CONFIGS), "nope")
    with pytest.raises(MetricSetError, match="no such folder"):
        resolve_config_dir(str(tmp_path / "missing"), "a")
    (tmp_path / "afile").write_text("")
    with pytest.raises(MetricSetError, match=r"afile: not a folder$"):  # was 'no such folder'
        resolve_config_dir(str(tmp_path / "afile"), "a")


def test_kaddrs_from_kallsyms(tmp_path: Path) -> None:
    table = tmp_path / "kallsyms"
    table.write_text("ffffffff81000000 T _stext\nffffffff81234560 T jiffies\n")
    assert kaddr_globals(("jiffies",), table) == {"kaddr_jiffies": 0xFFFFFFFF81234560}
    with pytest.raises(MetricSetError, match="no symbol nothere"):
        kaddr_globals(("nothere",), table)


#: /proc/kallsyms lines as this kernel (6.18) lists them: static functions of one
#: name in several files, then a module's (after a tab, its name in brackets)
DUPLICATED = (
    "ffffffff81000000 T _stext\n"
    "ffffffff81200ca0 t __cpuid\n"
    "ffffffff812edd10 t __cpuid\n"
    "ffffffff813227d0 t __cpuid\n"
    "ffffffffc0a01000 t __cpuid\t[kvm]\n"
)


def test_kaddrs_take_the_kernels_last_symbol_of_a_name(tmp_path: Path) -> None:
    # ebpf_exporter (exporter.go, populateKaddrs) keeps the last address a name has
    # in the kernel's own lines; a module's line is no match (its name field holds
    # the tab and "[kvm]"): the same config gets the same address from both.
    table = tmp_path / "kallsyms"
    table.write_text(DUPLICATED)
    assert kaddr_globals(("__cpuid",), table) == {"kaddr___cpuid": 0xFFFFFFFF813227D0}
    table.write_text("ffffffffc0a01000 t kvm_only\t[kvm]\n" + DUPLICATED)
    with pytest.raises(MetricSetError, match="no symbol kvm_only"):
        kaddr_globals(("kvm_only",), table)


# --- decoders ---------------------------------------------------------------------
def decode(name: str, value: bytes | str, ctx: DecoderContext | None = None, **opts) -> str:
    fn = build_decoder(DecoderSpec(name=name, **opts), ctx or DecoderContext())
    return fn(value)  # type: ignore[return-value]


def test_inet_ip_against_the_socket_module() -> None:
    for text in ("1.1.1.1", "192.168.0.254"):
        assert inet_ip(socket.inet_pton(socket.AF_INET, text)) == text
    for text in ("2606:4700::1111", "::1", "fe80::1:2:3:4"):
        raw = socket.inet_pton(socket.AF_INET6, text)
        assert inet_ip(raw) == socket.inet_ntop(socket.AF_INET6, raw)
    mapped = ipaddress.IPv6Address("::ffff:10.0.0.1").packed
    assert decode("inet_ip", mapped) == "10.0.0.1"


def test_dname_hex() -> None:
    assert dname(b"\x07example\x03com\x00") == "example.com"
    assert dname(b"\x00") == "."
    assert decode("hex", b"\x00\xab\x10") == "00ab10"


def test_ifname_against_the_system() -> None:
    for index, name in socket.if_nameindex():
        assert decode("ifname", struct.pack("<I", index)) == name
    assert decode("ifname", struct.pack("<I", 987654)) == "unknown:987654"


def test_kstack_and_ksym(tmp_path: Path) -> None:
    table = tmp_path / "kallsyms"
    table.write_text("ffffffff81000000 T do_syscall_64\nffffffff81000100 T x64_sys_call\n")
    ctx = DecoderContext(kallsyms=Kallsyms(table))
    stack = struct.pack("<4Q", 0xFFFFFFFF81000010, 0xFFFFFFFF81000105, 0x10, 0)
    assert decode("kstack", stack, ctx) == "x64_sys_call".join(["do_syscall_64\n", "\n??"])
    ee = build_decoder(DecoderSpec(name="ksym"), ctx, flavor=EBPF_EXPORTER_FORMAT)
    assert ee(struct.pack("<Q", 0x10)) == "unknown_addr:0x10"


def test_pci_names_from_pci_ids_or_hex(tmp_path: Path) -> None:
    ids = tmp_path / "pci.ids"
    ids.write_text(
        "# a few lines in pci.ids' layout\n"
        "8086  Intel Corporation\n"
        "\t1000  82542 Gigabit Ethernet Controller (Fiber)\n"
        "\t\t0e11 b0df  NC6132 Gigabit Ethernet Adapter\n"
        "C 02  Network controller\n"
        "\t00  Ethernet controller\n"
        "\t\t00  plain\n"
    )
    ctx = DecoderContext(pci=PciIds((ids,)))
    assert decode("pci_vendor", "32902", ctx) == "Intel Corporation"
    assert decode("pci_device", str(0x80861000), ctx) == "82542 Gigabit Ethernet Controller (Fiber)"
    assert decode("pci_class", "2", ctx) == "Network controller"
    assert decode("pci_subclass", str(0x0200), ctx) == "Ethernet controller"
    assert decode("pci_vendor", "4660", ctx) == "0x1234"
    none = DecoderContext(pci=PciIds((tmp_path / "absent",)))
    assert decode("pci_vendor", struct.pack("<H", 0x8086), none) == "0x8086"
    assert decode("pci_device", str(0x80861000), none) == "0x80861000"


def test_static_map_allow_unknown_and_regexp_group() -> None:
    table = {"1": "read"}
    assert decode("static_map", "7", static_map=table, allow_unknown=True) == "7"
    assert decode("static_map", "7", static_map=table) == "unknown:7"
    spec = DecoderSpec(name="regexp", regexps=["^(kswapd)[0-9]+$", "^bash$"])
    ee = build_decoder(spec, DecoderContext(), flavor=EBPF_EXPORTER_FORMAT)
    assert ee("kswapd0") == "kswapd"  # ebpf_exporter: the group is the label
    assert ee("bash") == "bash"
    assert build_decoder(spec, DecoderContext())("kswapd0") == "kswapd0"  # ours: the text


def test_dname_as_ebpf_exporter_decodes_it() -> None:
    """Its dname makes every length byte a dot (a zero one too) and gives a name
    whose label runs past the end as it is; ours raised (the series was dropped
    as a decoder error) and stopped at the root."""
    spec = DecoderSpec(name="dname")
    ee = build_decoder(spec, DecoderContext(), flavor=EBPF_EXPORTER_FORMAT)
    assert ee(b"") == "."
    assert ee(b"\x07example\x03com") == "example.com"
    assert ee(b"\x05com") == "\x05com"
    assert ee(b"\x03www\x07example\x03com\x00") == "www.example.com."
    string_first = LabelSpec(
        name="q", size=12, decoders=[DecoderSpec(name="string"), DecoderSpec(name="dname")]
    )
    (label,) = label_decoders([string_first], DecoderContext(), flavor=EBPF_EXPORTER_FORMAT)
    assert label(b"\x03www\x03com\x00\x00\x00\x00") == "www.com"


def test_regexp_label_is_what_matched_as_ebpf_exporter_gives_it() -> None:
    """ebpf_exporter's label is the match (its group, else the matched part),
    not the whole text; a pattern with two groups matches nothing there. The
    text was served whole, so ^systemd under it split per unit name."""
    spec = DecoderSpec(
        name="regexp", regexps=["^systemd", "^(a)(b)", "^x(y)?z", "^(kworker)/", "[0-9]+$"]
    )
    ee = build_decoder(spec, DecoderContext(), flavor=EBPF_EXPORTER_FORMAT)
    assert ee("systemd-journal") == "systemd"
    assert ee("ab1") == "1"  # ^(a)(b) has two groups: passed over for the next
    assert ee("xz") == ""  # its group took no part: Go gives an empty slice
    assert ee("python3") == "3"
    assert ee("kworker/0:1") == "kworker"
    for text in ("bash", "ab-job"):
        with pytest.raises(DropLabelSet):
            ee(text)
    ours = build_decoder(spec, DecoderContext())
    assert ours("systemd-journal") == "systemd-journal"  # ours keeps the text


def test_a_name_key_is_taken_and_the_file_names_the_set(tmp_path: Path) -> None:
    """ebpf_exporter's schema has a top-level ``name`` (the file's name replaces
    it): a config with one was read as our format and refused (``map`` missing)."""
    data = {"name": "other", "metrics": {"counters": [{"name": "timer_starts", "help": "h"}]}}
    ms = load_metric_set(write(tmp_path, "timers", data))
    assert ms.format == EBPF_EXPORTER_FORMAT and ms.name == "timers"
    (spec,) = ms.metrics
    assert spec.exposed_name == "ebpf_exporter_timer_starts"


def test_counter_served_under_its_own_name(tmp_path: Path) -> None:
    data = {"metrics": {"counters": [{"name": "timer_starts", "help": "h"}]}}
    (spec,) = load_metric_set(write(tmp_path, "t", data)).metrics
    assert isinstance(spec, EeCounterSpec)
    assert spec.exposed_name == "ebpf_exporter_timer_starts"  # no _total added
    assert spec.map == "timer_starts"
    with pytest.raises(ValueError, match="give default or allow_unknown"):
        LabelSpec(
            name="x",
            size=4,
            decoders=[
                DecoderSpec(
                    name="static_map", static_map={"1": "a"}, default="d", allow_unknown=True
                )
            ],
        )
