"""The conformance report: versions, one record per check, and the declared vs observed
capability matrix. Written as JSON by ``--cr-json`` / ``core-runner conformance --json``."""
from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from core_runner.registry import CAPABILITIES
from core_runner.sdk_version import SDK_VERSION

FAILING = ("failed", "error", "xpassed (strict xfail: fails the run)")


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions(session: Any) -> dict:
    import torch
    import transformers

    import core_runner

    plugin: dict[str, Any] = {"entry_point": session.plugin_name, "distribution": None, "version": None}
    if not session.from_module:
        from importlib.metadata import entry_points

        ep = next((e for e in entry_points(group="core_runner") if e.name == session.plugin_name), None)
        if ep is not None and ep.dist is not None:
            plugin.update(distribution=ep.dist.name, version=ep.dist.version)
    elif session.pm is not None:
        plugin.update(module=session.module, version=session.pm.plugins.get(session.plugin_name, {}).get("version"))
    return {
        "suite": core_runner.__version__,  # the suite ships inside core_runner, version-locked to it
        "core": _dist_version("core-runner") or core_runner.__version__,
        "sdk": SDK_VERSION,  # the plugin contract (core_runner.sdk + layers) the suite checks against
        "plugin": plugin,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hypothesis": _dist_version("hypothesis"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _observe(declared: str, recs: list[dict]) -> str:
    if not recs:
        return "not checked"
    outcomes = [r["outcome"] or "error" for r in recs]
    if any(o.startswith("xpassed") for o in outcomes):
        return "passes: declare it supported"
    if any(o in FAILING for o in outcomes):
        return {"supported": "broken", "unsupported": "not refused"}.get(declared, "broken")
    ran = [o for o in outcomes if not o.startswith("not run")]
    if not ran:
        return outcomes[0]
    if declared == "xfail":
        return "xfail (fails as declared)"
    if declared == "unsupported":
        return "unsupported (refused at config time)"
    return "supported"


def capability_matrix(session: Any, records: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for reg in session.registrations:
        row = {}
        for cap in CAPABILITIES:
            c = reg.capability(cap)
            recs = [r for r in records if r["architecture"] == reg.architecture and r["capability"] == cap]
            row[cap] = {"declared": c.state, "reason": c.reason, "observed": _observe(c.state, recs),
                        "checks": sorted({r["name"] for r in recs})}
        out[reg.architecture] = row
    return out


def task_matrix(session: Any, records: list[dict]) -> dict:
    """Per architecture, per task it declares: the checks of that task (the catalog's
    ``task``) and what they observed ("not checked" where this suite has no check of it)."""
    from core_runner.conformance.catalog import BY_ID

    out: dict[str, dict] = {}
    for reg in session.registrations:
        row = {}
        for task in reg.tasks:
            recs = [r for r in records if r["architecture"] == reg.architecture and r["id"] in BY_ID
                    and task in (BY_ID[r["id"]].task, *BY_ID[r["id"]].also_tasks)]
            row[task] = {"checks": sorted({r["name"] for r in recs}), "observed": _observe("supported", recs)}
        out[reg.architecture] = row
    return out


def build_report(session: Any, duration_s: float) -> dict:
    cases = session.generated_cases
    records = []
    for case in cases:
        rec = next((r for r in session.records.values() if r["name"] == case.name), None)
        if rec is None:  # deselected (-k) or the run was interrupted
            continue
        records.append(rec)
    summary: dict[str, int] = {}
    for r in records:
        key = "not run" if (r["outcome"] or "").startswith("not run") else (r["outcome"] or "error")
        summary[key] = summary.get(key, 0) + 1
    timing: dict[str, float] = {}
    for r in records:
        timing[r["id"]] = round(timing.get(r["id"], 0.0) + r["duration_s"], 3)
    failing = [r["name"] for r in records if (r["outcome"] or "error") in FAILING]
    if session.load_error and not any(r["id"] == "CR-REG-01" for r in records):
        failing.append(f"plugin load: {session.load_error}")
    return {
        "suite": "core_runner.conformance",
        "plugin": session.plugin_name,
        "outcome": "failed" if failing or not records else "passed",
        "failing": failing,
        "load_error": session.load_error,
        "tier": session.tier,
        "gpu": session.gpu,
        "duration_s": round(duration_s, 2),
        "timing_s": dict(sorted(timing.items(), key=lambda kv: -kv[1])),  # per check id, all its cases
        "model": getattr(session, "model", None),
        "dtype": session.tolerance.dtype if hasattr(session, "tolerance") else "float32",
        "versions": versions(session),
        "architectures": [r.architecture for r in session.registrations],
        "summary": summary,
        "capabilities": capability_matrix(session, records),
        "tasks": task_matrix(session, records),
        "checks": records,
    }


def summary_lines(report: dict) -> list[str]:
    lines = [f"plugin {report['plugin']}: {report['outcome'].upper()} "
             f"({', '.join(f'{v} {k}' for k, v in sorted(report['summary'].items()))}) in {report['duration_s']} s"]
    for arch, caps in report["capabilities"].items():
        lines.append(f"  {arch}")
        for task, t in report.get("tasks", {}).get(arch, {}).items():
            mark = "   <-- mismatch" if t["observed"] == "broken" else ""
            lines.append(f"    task {task:<13} observed {t['observed']}{mark}")
        for cap, c in caps.items():
            mark = "" if c["observed"] not in ("broken", "not refused") and not c["observed"].startswith("passes") \
                else "   <-- mismatch"
            lines.append(f"    {cap:<18} declared {c['declared']:<14} observed {c['observed']}{mark}")
    if report.get("model"):
        lines.append(f"  checkpoint {report['model']} (engine dtype {report['dtype']})")
    if report.get("timing_s"):
        lines.append("  time per check: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["timing_s"].items()))
    for name in report["failing"]:
        lines.append(f"  FAILED {name}")
    return lines
