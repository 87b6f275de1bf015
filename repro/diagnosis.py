"""Where SlimPack is not the fastest method: one line per setting, from the records alone.

Issue 24 asks for a diagnosis of every setting SlimPack loses (which method wins, by how
much, why). The records carry what decides it: each method's layout, its search (layouts
simulated of the candidates), its bubble fraction and step over its balanced ideal, recompute
and offload. The cause is named from those columns by fixed rules (:func:`cause`), so a reader
can check every line against the CSV; it is a pointer to where to look, not a proof.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import pandas as pd

from repro.experiments.common import (
    DOCUMENTS_WORKLOAD,
    SAMPLE_PIECES_WORKLOAD,
    documents_only,
    fits_memory,
    method_registry,
)

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

CHALLENGER = "slimpack"
CUTS_DOCUMENTS = frozenset({"megatron", "slimpipe"})
"""Methods that pack documents into fixed-length samples and cut a document at a sample
boundary into independent pieces under document masks (``Plan.documents.pieces``): a cut
tail no longer attends to its head, so the same batch has less attention work than under
SlimPack, which keeps documents whole. (``megatron-causal`` cuts too but attends across
documents: more work, not less.) tests/test_repro_diagnosis.py checks the set against the
planners."""


def _layout(cell: object) -> str:
    try:
        p = json.loads(str(cell))
    except (TypeError, ValueError):
        return str(cell)
    text = f"tp{p['tp']} cp{p['cp']} pp{p['pp']} dp{p['dp']}"
    return text + (f" v{p['vpp']}" if p.get("vpp", 1) > 1 else "")


def _num(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(pd.Series([row.get(column)]), errors="coerce").iloc[0]
    return float(value) if pd.notna(value) else math.nan


def cause(ours: pd.Series, winner: pd.Series,
          same_pieces: tuple[pd.Series, pd.Series] | None = None) -> str:
    """The first rule that holds, in this order (``same_pieces``: SlimPack's and the winner's
    rows on the same batch cut into sample pieces, where the records hold them):

    1. ``search``: the winner's layout is not the one SlimPack ran, SlimPack's search was
       capped (``layouts_simulated`` < its candidates less those pruned) and no winner-layout
       pass ran (``slimpack.planning.winners``: records without ``layouts_from_winners``, or
       points of one method): a layout it did not try may be faster. ``planner``: the layouts
       differ but SlimPack's search held the winner's layout (not capped, or the pass gave it
       the winner's layout), so SlimPack's own plan on it is the slower one; the rules below
       then say how its own best differs. Before ``planner``, ``documents`` (as rule 5, on
       any layouts): every method got the batch's documents, the winner cuts them at sample
       boundaries, and on the same batch cut into sample pieces (``same_pieces``: every
       method the same attention work) SlimPack is at least as fast as the winner. Where the
       winner cuts the documents and the records hold no sample pieces of the batch, the
       ``planner`` line names documents as the other candidate cause (the records cannot
       separate the two).
    2. ``bubble``: SlimPack's bubble fraction exceeds the winner's by more than 2 points.
    3. ``balance``: SlimPack's step over its ideal exceeds the winner's by more than 2%.
    4. ``recompute`` / ``offload``: SlimPack recomputes in a heavier mode, or offloads a larger
       share of its activations, than the winner.
    5. ``documents``: none of the above, the layouts are the same, every method got the
       batch's documents (:data:`DOCUMENTS_WORKLOAD`), the winner cuts documents
       at sample boundaries (:data:`CUTS_DOCUMENTS`) and SlimPack's balanced ideal step
       (``ideal_step_time_s``) is longer: the difference is the attention the cut removes, a
       semantic difference of the methods, not SlimPack's planning (measured,
       docs/slimpack-planner.md, "SlimPack vs SlimPipe on the same layout").
    6. ``kernel work``: none of the above: the same balance and bubble, so the difference is
       the work priced per kernel (slice shapes, CP sharding), a cost-model term.
    """
    same_layout = _layout(ours.get("parallel")) == _layout(winner.get("parallel"))
    simulated, candidates = _num(ours, "layouts_simulated"), _num(ours, "layouts_candidates")
    pruned = _num(ours, "layouts_pruned")
    capped = (not math.isnan(simulated) and not math.isnan(candidates)
              and simulated + (0 if math.isnan(pruned) else pruned) < candidates)
    if not same_layout and capped and not _winner_pass_ran(ours):
        return (f"search: SlimPack simulated {simulated:.0f} of {candidates:.0f} layouts "
                f"and not the winner's")
    cuts_ours = _cuts_our_documents(ours, winner)
    if same_pieces is not None and cuts_ours:
        lead = _num(same_pieces[0], "tokens_per_s") / _num(same_pieces[1], "tokens_per_s")
        if lead >= 1.0:
            return (f"documents: {winner.get('method')} cuts documents at its fixed-length "
                    f"sample boundaries (a cut tail no longer attends to its head) where "
                    f"SlimPack keeps them whole; on the same batch as sample pieces (the same "
                    f"attention for every method) SlimPack is {lead:.2f}x "
                    f"{winner.get('method')} (not a planner cause)")
    if not same_layout and capped:
        return ("planner: SlimPack was also planned on the winner's layout (winner-layout "
                "pass) and is slower there; at its own best layout, "
                + _mechanism_cause(ours, winner))
    if not same_layout and not math.isnan(candidates):
        held = ("planner: SlimPack's search held the winner's layout (simulated, or pruned by "
                "the bound), and SlimPack's plan there is slower than the winner's")
        if same_pieces is None and cuts_ours:
            # Without the batch's sample pieces in the records, the attention the winner's
            # cuts skip and SlimPack's planning cannot be told apart: say both.
            return (f"{held}, or documents: {winner.get('method')} cuts documents at its "
                    f"fixed-length sample boundaries (less attention work) and these records "
                    f"hold no run on the batch's sample pieces to tell the two apart")
        return held
    return _mechanism_cause(ours, winner)


RECOMPUTE_COST = {"none": 0, "selective": 1, "full": 2}
"""Recompute modes by the work they add (a record of mixed groups lists its modes)."""


def _costlier(column: str, ours: object, winner: object) -> bool:
    """Whether SlimPack's ``recompute`` or ``offload`` costs more than the winner's: a heavier
    recompute mode, a larger offloaded share. Offloading less than the winner (or recomputing
    less) cannot make SlimPack slower, so it names no cause."""
    if column == "recompute":
        def level(value: object) -> int:
            modes = [m.strip() for m in str(value or "none").split(",")]
            return max(RECOMPUTE_COST.get(m, 0) for m in modes)
        return level(ours) > level(winner)
    share = pd.to_numeric(pd.Series([ours, winner]), errors="coerce").fillna(0.0)
    return float(share.iloc[0]) > float(share.iloc[1])


def _winner_pass_ran(row: pd.Series) -> bool:
    """Whether the record's search went through the winner-layout pass with other methods."""
    if math.isnan(_num(row, "layouts_from_winners")):
        return False
    methods = row.get("methods")
    if isinstance(methods, str):
        try:
            methods = json.loads(methods)
        except ValueError:
            methods = None
    return not (isinstance(methods, list) and len(methods) == 1)


def _mechanism_cause(ours: pd.Series, winner: pd.Series) -> str:
    """Rules 2-6 of :func:`cause`."""
    bubble = _num(ours, "bubble_fraction") - _num(winner, "bubble_fraction")
    if bubble > 0.02:
        return f"bubble: SlimPack's bubble fraction is {100 * bubble:.0f} points higher"
    balance = _num(ours, "step_over_ideal") / _num(winner, "step_over_ideal")
    if balance > 1.02:
        return f"balance: SlimPack's step over its ideal is {balance:.2f}x the winner's"
    for column in ("recompute", "offload"):
        if _costlier(column, ours.get(column), winner.get(column)):
            return (f"{column}: SlimPack runs {column} {ours.get(column)}, the winner "
                    f"{winner.get(column)}")
    work = _num(ours, "ideal_step_time_s") / _num(winner, "ideal_step_time_s")
    same_layout = _layout(ours.get("parallel")) == _layout(winner.get("parallel"))
    # Only on one layout is the ideal-step gap the work of the same kernels on the same
    # shards: across layouts it also holds the layouts' own costs.
    if same_layout and _cuts_our_documents(ours, winner) and work > 1.0:
        return (f"documents: same bubble and balance; {winner.get('method')} cuts documents at "
                f"its fixed-length sample boundaries (a cut tail no longer attends to its "
                f"head) where SlimPack keeps them whole, and SlimPack's balanced ideal step is "
                f"{100 * (work - 1):.1f}% longer (its attention work is larger; not a planner "
                f"cause)")
    return "kernel work: same bubble and balance; the difference is per-kernel work"


def _cuts_our_documents(ours: pd.Series, winner: pd.Series) -> bool:
    """Whether every method of the setting got the batch's documents and the winner cuts
    them at sample boundaries where SlimPack keeps them whole."""
    workload = ours.get("workload", DOCUMENTS_WORKLOAD)
    documents = not isinstance(workload, str) or workload == DOCUMENTS_WORKLOAD
    return documents and str(winner.get("method")) in CUTS_DOCUMENTS


def _same_pieces(frame: pd.DataFrame, setting: pd.DataFrame,
                 winner: str) -> tuple[pd.Series, pd.Series] | None:
    """SlimPack's and ``winner``'s rows of the setting's sibling on the same batch cut into
    sample pieces (same description but the workload), or None where the records hold none."""
    if "workload" not in frame.columns:
        return None
    first = setting.iloc[0]
    pieces = frame[frame["workload"] == SAMPLE_PIECES_WORKLOAD]
    for column in DESCRIBE:
        if column != "workload" and column in frame.columns and pd.notna(first[column]):
            pieces = pieces[pieces[column] == first[column]]
    ours, theirs = (pieces[pieces["method"] == m] for m in (CHALLENGER, winner))
    if ours.empty or theirs.empty:
        return None
    return ours.iloc[0], theirs.iloc[0]


def losses(frame: pd.DataFrame, keys: list[str], *, value: str = "tokens_per_s",
           label: callable | None = None,
           siblings: pd.DataFrame | None = None) -> tuple[float, list[str]]:
    """(share of settings SlimPack wins, one diagnosis line per setting it loses). A setting is
    a group of ``keys`` holding SlimPack and another method; only methods that fit memory and
    planned can win (a plan over memory does not run), and a setting where none fits is
    left out. ``siblings`` (None: ``frame``) holds the sample-pieces rows the ``documents``
    rule looks up."""
    if frame.empty or CHALLENGER not in set(frame.get("method", [])):
        return math.nan, []
    frame = frame.assign(_fits=fits_memory(frame))
    wins = settings = 0
    lines = []
    for key, group in frame.groupby(keys, dropna=False):
        fitting = group[group["_fits"]]
        if fitting.empty or group["method"].nunique() < 2 or \
                not (group["method"] == CHALLENGER).any():
            continue
        settings += 1
        best = fitting.loc[pd.to_numeric(fitting[value]).idxmax()]
        if best["method"] == CHALLENGER:
            wins += 1
            continue
        name = label(key) if label else ", ".join(map(str, key if isinstance(key, tuple)
                                                      else (key,)))
        ours = fitting[fitting["method"] == CHALLENGER]
        if ours.empty:
            lines.append(f"{name}: {best['method']} wins; memory: SlimPack's plan does not "
                         f"fit (or failed to plan)")
            continue
        mine = ours.iloc[0]
        ratio = float(best[value]) / float(mine[value])
        pieces = _same_pieces(frame if siblings is None else siblings, group, str(best["method"]))
        diagnosis = cause(mine, best, pieces)
        lines.append(f"{name}: {best['method']} {ratio:.2f}x faster ({_layout(best['parallel'])}"
                     f" vs SlimPack's {_layout(mine['parallel'])}); {diagnosis}")
    return (wins / settings if settings else math.nan), lines


SETTING_EXPERIMENTS: dict[str, list[str]] = {
    "e2e-throughput": ["point_key"], "paper-scale": ["dataset", "seed", "token_budget"],
    "batch-size": ["point_key"], "scalability": ["point_key"], "balance": ["point_key"],
    "memory": ["point_key"], "outliers": ["point_key"], "solver-overhead": ["point_key"]}
"""The experiments whose points are settings SlimPack is compared in (one workload, every
method), and what makes a setting: a point, or for ``paper-scale`` (one method per point) the
workload columns. Left out: sensitivity corners (``robustness``), ablations, FlexSP's own
protocol (no SlimPack)."""
SIBLINGS_ONLY = frozenset({"balance"})
"""Experiments whose sample-pieces points run SlimPack and the methods that cut documents only
(``repro.experiments.balance``): the ``documents`` rule's siblings, not settings (a setting
without every method would be a win on easier terms)."""
DESCRIBE = ("model", "dataset", "context", "num_gpus", "global_batch", "token_budget", "seed",
            "protocol", "workload")


def _settings(frame: pd.DataFrame, keys: list[str]) -> int:
    """How many settings :func:`losses` judged (its rule for what counts)."""
    fits = fits_memory(frame)
    return sum(1 for _, g in frame.assign(_fits=fits).groupby(keys, dropna=False)
               if g["_fits"].any() and g["method"].nunique() >= 2
               and (g["method"] == CHALLENGER).any())


def describe_setting(group: pd.DataFrame) -> str:
    row = group.iloc[0]
    parts = [f"{c} {row[c]}" for c in DESCRIBE if c in group.columns and pd.notna(row[c])]
    return ", ".join(parts)


def report_lines(records_of: callable, registry: MethodRegistry | None = None) -> list[str]:
    """The report's section: per experiment, the share of settings SlimPack wins and a line
    per loss. ``records_of(name)`` returns an experiment's records; rows of methods not in
    ``registry`` (None: the suite's), such as variants, are left out."""
    registered = set(method_registry(registry).names())
    lines, won, total = [], 0, 0
    for name, keys in SETTING_EXPERIMENTS.items():
        frame = records_of(name)
        if frame.empty or "method" not in frame.columns:
            continue
        frame = frame[frame["method"].isin(registered)]
        if "protocol" in frame.columns:  # e2e-throughput: each protocol's rows are a setting
            keys = [*keys, "protocol"]
        siblings = frame
        if name in SIBLINGS_ONLY:
            frame = documents_only(frame)
        labels = {key: describe_setting(g) for key, g in frame.groupby(keys, dropna=False)}
        share, losses_here = losses(frame, keys, label=labels.__getitem__, siblings=siblings)
        if math.isnan(share):
            continue
        n = _settings(frame, keys)
        won += round(share * n)
        total += n
        lines.append(f"- **{name}**: SlimPack fastest in {round(share * n)} of {n} settings.")
        # By the setting's description: point keys (the groups' order) change with the code.
        lines += [f"  - {line}" for line in sorted(losses_here)]
    if not total:
        return []
    return ["## Where SlimPack is not the fastest", "",
            f"Over {total} settings of {len(SETTING_EXPERIMENTS)} experiments (methods that "
            f"fit memory only), SlimPack has the highest throughput in {won} "
            f"({100 * won / total:.0f}%). Each loss names the winner, the two layouts and the "
            "first of these causes that the records show (`repro/diagnosis.py`): a capped "
            "search that did not try the winner's layout, a larger pipeline bubble, a worse "
            "balance (step over its ideal), recompute or offload, the attention a winner "
            "that cuts documents at sample boundaries does not do (on the same layout, or "
            "wherever SlimPack wins the same batch cut into sample pieces), else per-kernel "
            "work.", "",
            *lines, ""]
