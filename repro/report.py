"""``results/REPORT.md``: one claims table and a section per experiment with its figures.

Every reproduced value and verdict comes from the stored records through the experiment's own
``claims`` function and its :class:`~repro.experiment.Check`; nothing here is typed in by hand.
An experiment that has not run still lists its claims, with "no data".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from repro import executability
from repro.analysis import load_records
from repro.diagnosis import report_lines
from repro.experiment import Claim
from repro.figures import method_order
from repro.registry import experiment_names, resolve_experiment

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

VERDICT_MARK = {"reproduced": "yes", "not reproduced": "**no**", "no data": "no data"}
CHECK_MARK = {"reproduced": "pass", "not reproduced": "**fail**", "no data": "no data"}


@dataclass(frozen=True, kw_only=True)
class ExperimentClaims:
    experiment: str
    claims: tuple[Claim, ...]
    error: str = ""


def collect_claims(results_dir: Path, registry: str = "repro.registry",
                   names: list[str] | None = None) -> list[ExperimentClaims]:
    out = []
    for name in names if names is not None else experiment_names(registry):
        experiment = resolve_experiment(name, registry)
        records = load_records(results_dir, name)
        try:
            claims = tuple(experiment.claims(records))
            out.append(ExperimentClaims(experiment=name, claims=claims))
        except Exception as exc:  # noqa: BLE001 - one broken experiment must not hide the rest
            out.append(ExperimentClaims(experiment=name, claims=(),
                                        error=f"{type(exc).__name__}: {exc}"))
    return out


def claims_frame(collected: list[ExperimentClaims]) -> pd.DataFrame:
    rows = []
    for entry in collected:
        for claim in entry.claims:
            rows.append({"experiment": entry.experiment, "claim_id": claim.claim_id,
                         "claim": claim.text, "source": claim.source,
                         "hardware": claim.hardware, "paper_value": claim.paper_value,
                         "reproduced": claim.reproduced, "reproduced_text": claim.reproduced_text(),
                         "unit": claim.unit, "rule": claim.check.describe(),
                         "reason": claim.check.reason, "kind": claim.kind,
                         "verdict": claim.verdict, "analysis": claim.analysis})
    return pd.DataFrame(rows)


def _table(frame: pd.DataFrame, marks: dict[str, str] = VERDICT_MARK) -> list[str]:
    lines = ["| claim | source | paper value | reproduced value | rule | why this rule | verdict |",
             "|---|---|---|---|---|---|---|"]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_md_cell(v) for v in (
            f"{row['claim']} ({row['hardware']})", row["source"], row["paper_value"],
            row["reproduced_text"], row["rule"], row["reason"], marks[row["verdict"]]))
            + " |")
    return lines


def _not_reproduced(claims: pd.DataFrame) -> list[str]:
    """A section with what the records show for every claim that is not reproduced."""
    if claims.empty:
        return []
    missed = claims[claims["verdict"] == "not reproduced"]
    if missed.empty:
        return []
    lines = ["## Claims not reproduced: what the records show", ""]
    for _, row in missed.iterrows():
        analysis = row["analysis"] or "_No measured analysis yet._"
        lines.append(f"- **{row['claim']}** ({row['experiment']}): {row['reproduced_text']} "
                     f"against {row['paper_value']}. {analysis}")
    return lines + [""]


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(_md_cell(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(_md_cell(_fmt(v)) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def render_report(results_dir: Path, registry: str = "repro.registry",
                  method_registry: MethodRegistry | None = None) -> str:
    """REPORT.md's text from the records: ``registry`` names the experiments' module,
    ``method_registry`` the methods (None: the suite's)."""
    collected = collect_claims(results_dir, registry)
    frame = claims_frame(collected)
    is_claim = frame["kind"] == "claim" if not frame.empty else pd.Series(dtype=bool)
    claims = frame[is_claim] if not frame.empty else frame
    checks = frame[~is_claim] if not frame.empty else frame
    counts = claims["verdict"].value_counts().to_dict() if not claims.empty else {}
    check_counts = checks["verdict"].value_counts().to_dict() if not checks.empty else {}
    lines = [
        "# SlimPack suite: reproduction report",
        "",
        "Generated by `python -m repro report` from the records in this directory only. "
        "`make reproduce` recomputes every point into `build/reproduce/`, compares the new "
        "records with the committed ones and writes this report there; `python -m repro run "
        "all --fresh --results-dir results` refreshes the committed ones. Simulated numbers "
        "come from the kernel-level cost model (validated against published Megatron-LM runs: "
        "see `megatron-validation` below) and the DAG simulator; SlimPack's solver is a "
        "*reconstruction* (see README), so its numbers are ours, not the paper's. Batch sizes "
        "are stated in tokens in each experiment's description and figure titles.",
        "",
        f"Claims: {len(claims)}; reproduced {counts.get('reproduced', 0)}, not reproduced "
        f"{counts.get('not reproduced', 0)}, no data {counts.get('no data', 0)}. A verdict is "
        "the rule applied to the reproduced value; every rule says why its tolerance or bound "
        "is what it is. Where SlimPack is compared with Megatron-LM, the value is shown against "
        "`megatron` (document masks) and `megatron-causal` (full-causal samples) and judged on "
        "the first.",
        "",
        f"Consistency checks (the suite agreeing with itself or with a closed form, not "
        f"published claims): {len(checks)}; passing {check_counts.get('reproduced', 0)}, "
        f"failing {check_counts.get('not reproduced', 0)}, no data "
        f"{check_counts.get('no data', 0)}.",
        "",
        "## Claims",
        "",
        *_table(claims),
        "",
        *_not_reproduced(claims),
        *report_lines(lambda name: load_records(results_dir, name), method_registry),
        *executability.report_lines(lambda name: load_records(results_dir, name),
                                    lambda present: method_order(present, method_registry)),
        "## Consistency checks",
        "",
        "Checks that hold by construction of a schedule or a model, or test the suite against "
        "its own closed forms and budgets: a failure is a bug in the suite, a pass reproduces "
        "nothing.",
        "",
        *_table(checks, CHECK_MARK),
    ]
    for entry in collected:
        experiment = resolve_experiment(entry.experiment, registry)
        records = load_records(results_dir, entry.experiment)
        lines += ["", f"## {entry.experiment}", "", experiment.description, ""]
        if records.empty:
            lines.append(f"_Not run yet: `python -m repro run {entry.experiment}`._")
        else:
            backends = ", ".join(sorted(map(str, records["backend"].unique())))
            lines.append(f"{records['point_key'].nunique()} points, {len(records)} records "
                         f"(backend: {backends}); `results/{entry.experiment}/records.csv`.")
        if entry.error:
            lines += ["", f"**Claims could not be computed:** {entry.error}"]
        if experiment.tables is not None and not records.empty:
            for title, table in experiment.tables(records):
                lines += ["", f"**{title}**", "", _md_table(table)]
        for png in sorted((results_dir / entry.experiment).glob("*.png")):
            lines += ["", f"![{entry.experiment}: {png.stem}]({entry.experiment}/{png.name})"]
    return "\n".join(lines) + "\n"


def write_report(results_dir: Path, registry: str = "repro.registry") -> Path:
    path = results_dir / "REPORT.md"
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(results_dir, registry), encoding="utf-8")
    return path
