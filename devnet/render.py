"""How a person reads a local network: short ids, and the demo's summary as a table of runs,
challenges and verifiers (with the fees paid to each and the penalties taken) and the checks it
makes."""

from __future__ import annotations

from typing import Any


def short(b: bytes | str) -> str:
    """The first 12 hex digits of an id or an account, enough to tell them apart in a log."""
    return (b.hex() if isinstance(b, bytes) else b)[:12]


def render(summary: dict[str, Any]) -> str:
    """The summary as a person reads it."""
    out = [f"\nSummary ({summary['seconds']:.0f} s on {summary['chain']})", "  runs:"]
    for r in summary["runs"]:
        label = "honest" if r["honest"] else f"substituted batch at step {r['substituted_step']}"
        verdicts = ", ".join(f"step {v['step']}: {v['verdict']}" for v in r["verdicts"])
        trained = f"trained in {r['training_seconds']:.0f} s" if r["training_seconds"] is not None else ""
        out.append(f"    {(r['run_id'] or '?')[:16]}  {label:<30} {verdicts}  {trained}"
                   + (f"  slashed {r['slashed']}" if r["slashed"] else ""))
    out.append("  challenges:")
    out.append(
        f"    {'id':<16}  {'run':<16}  {'step':>4}  {'verdict':<12} {'cluster':>7}  {'took':>6}  outliers"
        "   (cluster: seats of the winning cluster / verifiers that revealed)"
    )
    for c in summary["challenges"]:
        took = f"{c['seconds']:.0f} s" if c["seconds"] is not None else "-"
        out.append(f"    {c['id'][:16]}  {c['run_id'][:16]}  {c['step']:>4}  {str(c['verdict']):<12} "
                   f"{c['cluster_size']}/{c['reveals']:<5}  {took:>6}  {', '.join(c['outliers']) or '-'}")
    out.append("  verifiers:")
    out.append(
        f"    {'name':<4}  {'role':<28} {'outlier':>7}  {'seats':>5}  {'fees paid':>9}  {'penalised':>9}  "
        "bond"
        "   (outlier: challenges outside the winning cluster; fees and penalties are per seat)"
    )
    for v in summary["verifiers"]:
        what = {
            "none": "honest",
            "noise": "faulty (reveals noise)",
            "lazy": "lazy (reveals public data)",
        }.get(v.get("fault", "none" if not v["faulty"] else "noise"), str(v.get("fault")))
        bond = f"{v['bond_before']} -> {v['bond_after']}" if "bond_before" in v else "-"
        outlier = f"{v['outlier_count']}/{len(summary['challenges'])}"
        out.append(
            f"    {v['name']:<4}  {what:<28} {outlier:>7}  {v.get('seats', '-'):>5}  {v.get('paid', '-'):>9} "
            " "
            f"{v.get('penalised', '-'):>9}  {bond}"
        )
    out.append(
        "  checks: " + ", ".join(f"{k} {'yes' if ok else 'NO'}" for k, ok in summary["checks"].items())
    )
    where = summary["workdir"] if summary.get("workdir_kept") else \
        f"{summary['workdir']} (removed at exit; --workdir keeps them)"
    out.append(f"  timings: {summary['timings']}; logs and files in {where}")
    return "\n".join(out)
