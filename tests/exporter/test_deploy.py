"""deploy/: the exporter as operators run it. The systemd unit passes
`systemd-analyze verify` and its hardening still lets the BPF programs load;
the DaemonSet passes the Kubernetes schema (kubernetes-validate, strict); the
Prometheus config passes `promtool check config`; every PromQL expression of
the Grafana dashboard parses (promtool) and returns data from a real
Prometheus scraping a real exporter, and is shown in a unit that fits what the
exporter declares its metric to be (counter, gauge, histogram)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, needs_tools, skip_here
from tests.exporter.conftest import LIVE_SETS

DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "kernmlops-exporter.service"
DAEMONSET = DEPLOY / "kubernetes" / "daemonset.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "kernmlops-exporter.json"


def unit_settings(text: str) -> dict[str, str]:
    """``Key=value`` lines of a unit (continuation lines joined; a key given on
    several lines, as Environment=, keeps them all, a space apart)."""
    text = text.replace("\\\n", " ")
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            key = key.strip()
            out[key] = f"{out[key]} {value.strip()}" if key in out else value.strip()
    return out


def unit_environment(settings: dict[str, str]) -> dict[str, str]:
    """The variables the unit's Environment= lines set (quoted as systemd reads them)."""
    return dict(a.split("=", 1) for a in shlex.split(settings["Environment"]))


def unit_sets(settings: dict[str, str]) -> list[str]:
    """The metric sets the unit serves (its default KERNMLOPS_EXPORTER_ARGS)."""
    args = shlex.split(unit_environment(settings)["KERNMLOPS_EXPORTER_ARGS"])
    return [args[i + 1] for i, a in enumerate(args) if a == "-c"]


# --- systemd -------------------------------------------------------------------------
@needs_tools("systemd-analyze")
def test_the_systemd_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    text = UNIT.read_text()
    settings = unit_settings(text)
    assert settings["CapabilityBoundingSet"].split() == ["CAP_BPF", "CAP_PERFMON"]
    assert settings["NoNewPrivileges"] == "yes"
    assert settings["ProtectSystem"] == "strict"
    # the BPF folder, set by the unit itself and writable there: the built-in objects
    # are copied into it, a .bpf.c config compiles into it
    assert settings["CacheDirectory"] == "kernmlops-exporter"
    bpf_dir = unit_environment(settings)["KERNMLOPS_BPF_DIR"]
    assert bpf_dir == "/var/cache/kernmlops-exporter"
    assert "--capabilities.keep=none" in settings["ExecStart"]
    assert "--web.config.file=" in settings["ExecStart"]
    assert unit_sets(settings) == list(LIVE_SETS)  # what the dashboard test serves
    # verify checks that ExecStart's program exists: point it at this install's
    here = shutil.which("kernmlops") or str(Path(sys.executable).with_name("kernmlops"))
    assert Path(here).exists()

    def verify(unit_text: str, name: str) -> str:
        unit = tmp_path / name
        unit.write_text(unit_text.replace("/opt/kernmlops/bin/kernmlops", here))
        out = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 or name != "kernmlops-exporter.service", out.stderr
        # it names the file for each problem it finds (and exits 0 for some of them)
        return "\n".join(line for line in (out.stdout + out.stderr).splitlines() if name in line)

    assert verify(text, "kernmlops-exporter.service") == ""
    # and verify does find a problem there (the check above is no empty run)
    broken = text.replace("ProtectSystem=strict", "ProtectSystem=stricter")
    assert "stricter" in verify(broken, "broken.service")


def _bounding_set_removals() -> dict[str, set[str]]:
    """option -> the capabilities systemd.exec(5), as installed, says it removes from
    the bounding set when on (ProtectKernelLogs: CAP_SYSLOG, ...), and "/proc/kallsyms"
    for an option it says makes that file inaccessible."""
    import gzip

    pages = sorted(Path("/usr/share/man/man5").glob("systemd.exec.5*"))
    if not pages:
        skip_here("systemd.exec(5) is not installed (the systemd package's man pages)")
    raw = pages[0].read_bytes()
    text = (gzip.decompress(raw) if pages[0].suffix == ".gz" else raw).decode()
    text = re.sub(r"\\f[BIRP]|\\&", "", text).replace("\\-", "-")
    out: dict[str, set[str]] = {}
    for section in re.split(r"\n\.PP\n", text):
        head = re.match(r"(\w+)=\n", section)
        removed = re.findall(r"remove[sd]?\s+(.*?)\s+from the capability bounding set", section,
                             re.S)  # fmt: skip
        if head and removed:
            out[head[1]] = {c for r in removed for c in re.findall(r"CAP_[A-Z_]+", r)}
        if head and re.search(r"/proc/kallsyms\s.*?inaccessible", section, re.S):
            out.setdefault(head[1], set()).add("/proc/kallsyms")
    return out


def test_a_capability_the_unit_says_to_add_is_not_removed_by_its_hardening() -> None:
    # Issue: it said to add CAP_SYSLOG for ksym/kstack labels, and ProtectKernelLogs=yes
    # takes CAP_SYSLOG out of the bounding set whatever CapabilityBoundingSet= holds
    text = UNIT.read_text()
    settings = unit_settings(text)
    comments = " ".join(x.lstrip("# ") for x in text.splitlines() if x.startswith("#"))
    bounded = set(settings["CapabilityBoundingSet"].split())
    to_add = set(re.findall(r"CAP_[A-Z_]+", comments)) - bounded
    assert "CAP_SYSLOG" in to_add
    removals = _bounding_set_removals()
    assert "CAP_SYSLOG" in removals.get("ProtectKernelLogs", set()), sorted(removals)
    # ksym and kstack labels read /proc/kallsyms (with CAP_SYSLOG, its addresses)
    assert "ksym" in comments
    to_add.add("/proc/kallsyms")
    for option, caps in removals.items():
        if settings.get(option) == "yes" and caps & to_add:
            assert f"{option}=no" in comments, (option, sorted(caps & to_add))


def test_the_unit_does_not_restart_on_a_user_error_and_the_exporter_exits_with_that_status(
    tmp_path: Path,
) -> None:
    """A bad configuration restarted every 5 s forever filled the journal and never
    mended itself: the unit's RestartPreventExitStatus is the status the exporter
    gives user errors (its own command line, with a web.yml missing or a set misspelt)."""
    settings = unit_settings(UNIT.read_text())
    assert settings["Restart"] == "on-failure"
    status = int(settings["RestartPreventExitStatus"])
    env = unit_environment(settings)["KERNMLOPS_EXPORTER_ARGS"]
    args = shlex.split(settings["ExecStart"].replace("$KERNMLOPS_EXPORTER_ARGS", env))[1:]
    assert args[0] == "export"
    web = tmp_path / "web.yml"  # not there
    cmd = [sys.executable, "-m", "kernmlops"]
    cmd += [a.replace("/etc/kernmlops/web.yml", str(web)) for a in args]
    for broken in (cmd, [*cmd, "-c", "nosuchset"]):  # no web.yml; a set misspelt
        if broken is not cmd:
            web.write_text("basic_auth_users: {}\n")
        out = subprocess.run(broken, capture_output=True, text=True, timeout=60)
        assert out.returncode == status, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def unit_command(settings: dict[str, str], web: Path, listen: str) -> list[str]:
    """The unit's ExecStart as this Python runs it, its default arguments expanded,
    ``web`` for its web.yml and ``listen`` for its --web.listen-address."""
    env = unit_environment(settings)["KERNMLOPS_EXPORTER_ARGS"]
    args = shlex.split(settings["ExecStart"].replace("$KERNMLOPS_EXPORTER_ARGS", env))[1:]
    assert args[0] == "export" and "--web.listen-address=:9435" in args
    args = [a.replace("/etc/kernmlops/web.yml", str(web)) for a in args]
    args = [f"--web.listen-address={listen}" if a.startswith("--web.listen-") else a for a in args]
    return [sys.executable, "-m", "kernmlops", *args]


def _seconds(value: str) -> float:
    """A systemd time span of one unit (``120s``, ``2min``) in seconds."""
    number, unit = re.fullmatch(r"(\d+)\s*(s|min)?", value).groups()  # type: ignore[union-attr]
    return float(number) * (60 if unit == "min" else 1)


# --- Kubernetes ----------------------------------------------------------------------
def test_the_daemonset_passes_the_kubernetes_schema() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["hostPID"] is True
    assert c["readinessProbe"]["httpGet"]["path"] == "/metrics"
    assert set(c["resources"]["limits"]) == {"cpu", "memory"}
    assert c["securityContext"]["capabilities"]["add"] == ["BPF", "PERFMON"]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/sys", "/sys/kernel/tracing"}
    args = c["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "-c"] == list(LIVE_SETS)
    assert "--capabilities.keep=none" in args
    # the validator is strict: a misspelt field fails it
    c["readinessProb"] = c.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessProb"):
        kubernetes_validate.validate(ds, version, strict=True)


def test_the_daemonset_names_the_scrape_config_that_finds_its_pods() -> None:
    # Issue: its header sent the reader to prometheus.yml, the static targets of the
    # systemd unit's machines, which finds no pod.
    named = re.findall(r"\.\./prometheus/[\w.-]+\.yml", DAEMONSET.read_text())
    assert named, "the DaemonSet names no scrape config"
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    for ref in named:
        config = yaml.safe_load((DAEMONSET.parent / ref).read_text())
        (job,) = config["scrape_configs"]
        sd = job["kubernetes_sd_configs"][0]
        assert sd["namespaces"]["names"] == [ds["metadata"]["namespace"]], ref
        keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
        (label,) = keep["source_labels"]
        # Prometheus' name of the pod's prometheus.io/scrape annotation
        key = next(k for k in annotations
                   if label.endswith(re.sub(r"\W", "_", k)))  # fmt: skip
        assert re.fullmatch(keep["regex"], annotations[key]), (ref, key)


# --- Prometheus and Grafana ------------------------------------------------------------
@needs_tools("promtool")
def test_the_prometheus_scrape_config_passes_promtool() -> None:
    out = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    # the Kubernetes one (Debian's promtool has no Kubernetes discovery): its regexes
    k8s = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (job,) = k8s["scrape_configs"]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    for rule in job["relabel_configs"]:
        re.compile(rule.get("regex", "(.*)"))


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with Grafana's variables as a
    dashboard showing every job and instance would set them."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "15s")
            expr = expr.replace("$instance", ".*").replace("$job", ".*")
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    # the job and instance variables: label_values(SELECTOR, label) needs SELECTOR's series
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            found = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["definition"])
            assert found, var["definition"]
            out.append((f"variable {var['name']}", found[1].replace("$job", ".*")))
    return out


def test_the_dashboard_is_provisioned_from_its_file() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "kernmlops.yaml").read_text()
    )
    assert provider["providers"][0]["type"] == "file"
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for what in ("run-queue latency", "block i/o latency", "system calls", "failed system calls"):
        assert what in titles
    kinds = {p["type"] for p in dash["panels"]}
    assert "heatmap" in kinds


def declared_kinds(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, str]]:
    """Every series name the exporter serves -> (its family's type, the family's name),
    from the exporter's own declarations: the built-in sets' metrics, its own metrics
    (the BPF run-time ones included), its server's; and Prometheus's ``up``."""
    from kernmlops.exporter.config import CounterSpec, builtin_sets
    from kernmlops.exporter.core import Exporter
    from kernmlops.exporter.server import ServerStats

    families: dict[str, str] = {"up": "gauge"}
    for metric_set in builtin_sets().values():
        for m in metric_set.metrics:
            if isinstance(m, CounterSpec):
                families[m.exposed_name.removesuffix("_total")] = "counter"
            else:
                families[m.name] = "histogram"
    monkeypatch.setattr(Exporter, "bpf_stats_on", property(lambda _self: True))
    for family in [*Exporter([])._self_metrics(0.0), *ServerStats().collect()]:
        families[family.name] = family.type
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        name + suffix: (kind, name) for name, kind in families.items() for suffix in suffixes[kind]
    }


#: Grafana's units of a rate of events per second, of a plain count, of bytes per second
PER_SECOND = {"ops", "reqps", "cps", "iops", "rps", "wps"}
COUNT = {"short", "none", None}
BYTES_PER_SECOND = {"Bps", "binBps", "decbytes/s"}


def _unit_wanted(expr: str, kinds: dict[str, tuple[str, str]]) -> set[str | None]:
    """The units a panel may show ``expr``'s result in, from what the exporter declares
    its one metric to be: a histogram's quantile has the histogram's unit; a rate of a
    counter is per second (bytes per second for a count of bytes); a gauge has its own
    unit (seconds, bytes), else it is a count."""
    names = {n for n in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if n in kinds}
    assert len(names) == 1, f"{expr}: one metric the exporter declares, not {names}"
    (series,) = names
    kind, family = kinds[series]
    rated = re.search(rf"\b(?:rate|irate|increase)\(\s*{series}\b", expr) is not None
    if kind == "counter":
        assert rated, f"{expr}: a counter shown raw (it only grows): rate() it"
    else:
        assert not rated or series.endswith("_bucket"), f"{expr}: rate() of a gauge"
    if kind == "histogram":
        assert "histogram_quantile(" in expr, f"{expr}: a histogram's buckets, not a quantile"
        return {"s"} if family.endswith("_seconds") else {"bytes", "decbytes"}
    if kind == "counter":
        return BYTES_PER_SECOND if family.endswith("_bytes") else PER_SECOND
    if family.endswith("_seconds"):
        return {"s"}
    return {"bytes", "decbytes"} if family.endswith("_bytes") else COUNT


def test_every_dashboard_unit_fits_what_its_query_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kinds = declared_kinds(monkeypatch)
    dash = json.loads(DASHBOARD.read_text())
    checked = 0
    for panel in dash["panels"]:
        if panel["type"] == "heatmap":  # the buckets' bounds are its y axis
            (target,) = panel["targets"]
            assert re.search(r"rate\(kernmlops_\w+_seconds_bucket\b", target["expr"])
            assert panel["options"]["yAxis"]["unit"] == "s"
            continue
        config = panel.get("fieldConfig", {})
        units = {
            o["matcher"]["options"]: prop["value"]
            for o in config.get("overrides", [])
            if o["matcher"]["id"] == "byFrameRefID"
            for prop in o["properties"]
            if prop["id"] == "unit"
        }
        for target in panel.get("targets", []):
            unit = units.get(target["refId"], config.get("defaults", {}).get("unit"))
            wanted = _unit_wanted(target["expr"], kinds)
            assert unit in wanted, (
                f"panel {panel['title']!r}, {target['legendFormat']!r}: unit {unit!r}, "
                f"not one of {sorted(map(str, wanted))}: {target['expr']}"
            )
            checked += 1
    assert checked >= 15


def _query(api: str, expr: str) -> list[dict]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _activity(stop: threading.Event, folder: Path) -> None:
    """What the dashboard shows per job: block I/O (written and synced) and
    failed system calls, from this process (a job of its own name)."""
    data = folder / "io"
    while not stop.wait(0.05):
        with data.open("wb") as fh:
            fh.write(os.urandom(64 * 1024))
            fh.flush()
            os.fsync(fh.fileno())
        for _ in range(20):
            with contextlib.suppress(FileNotFoundError):
                os.stat(folder / "missing")


def test_the_web_config_examples_hash_command_runs_with_the_exporters_python() -> None:
    # Issue: it said `python3 -c 'import bcrypt ...'`: Debian's python3 has no bcrypt
    # (python3-bcrypt is not a dependency of anything deployed); the exporter's venv has
    import bcrypt

    text = (DEPLOY / "web.yml.example").read_text()
    (line,) = [x for x in text.splitlines() if "bcrypt.hashpw" in x]
    argv = shlex.split(line.strip().lstrip("#").strip())
    # the interpreter of the venv the unit runs (its ExecStart's folder)
    exec_start = unit_settings(UNIT.read_text())["ExecStart"].split()[0]
    assert Path(argv[0]).parent == Path(exec_start).parent, argv[0]
    # the command itself, with this venv's Python in its place: a hash the server takes
    out = subprocess.run([sys.executable, *argv[1:]], input="s3cret\n", capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    hashed = out.stdout.strip().splitlines()[-1]
    assert bcrypt.checkpw(b"s3cret", hashed.encode())


def test_every_install_instruction_makes_the_web_config_folder_roots_only() -> None:
    # Issue: the unit's header made /etc/kernmlops with install's default mode (0755
    # under umask 022), deploy/README 0700: web.yml names the TLS key beside it
    found = []
    for path in (UNIT, DEPLOY / "README.md"):
        for line in path.read_text().splitlines():
            for cmd in line.lstrip("# ").split("&&"):
                argv = shlex.split(cmd.split("#", 1)[0]) if "install -d" in cmd else []
                if argv and argv[-1] == "/etc/kernmlops":
                    found.append(path.name)
                    assert "-m" in argv and argv[argv.index("-m") + 1] == "0700", (path, line)
    assert sorted(found) == ["README.md", UNIT.name]
