"""Regenerate the shipped profiles in ``datasets/profiles/``.

    python -m slimpack.data.shipped_profiles [--shared-dir DIR] [--out DIR]

Empirical profiles are built from the raw samples in ``../shared/length_distributions``
(``SLIMPACK_SHARED_DIR`` overrides); parametric "-like" profiles are fitted to the facts below.
Every number used as a fit target is listed with its source and whether it is published or our
assumption; the achieved value of each is written into the profile.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

from slimpack.data.empirical import build_empirical_profile
from slimpack.data.parametric import Fact, ParametricSpec, SplicedParetoModel, fit_parametric_profile
from slimpack.data.profile import Profile, save_profile
from slimpack.data.readers import read_lengths

SHARED_DIR_ENV = "SLIMPACK_SHARED_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]

SPLIT_NOTE = (
    "split: a document longer than the context becomes context-length pieces plus its "
    "remainder (Megatron-style concat-and-chunk keeps every token); truncate and drop are "
    "available per experiment."
)


@dataclass(frozen=True, kw_only=True)
class EmpiricalSpec:
    name: str
    filename: str
    description: str
    provenance: str
    licence: str
    truncation_note: str = SPLIT_NOTE


EMPIRICAL_SPECS: tuple[EmpiricalSpec, ...] = (
    EmpiricalSpec(
        name="wikipedia",
        filename="flexsp_wikipedia_sample_1M.txt",
        description="Tokenized lengths of 1,000,000 Wikipedia documents: the sample FlexSP's "
        "solver reads (read_dataset('wikipedia')).",
        provenance="PKU-DAIR/Hetu-Galvatron, branch flexsp @ b466689, "
        "galvatron/datasets/wikipedia.txt (sha256 50cb24dd...); tokenizer not stated, GPT-2 "
        "BPE likely (vocab 50257 in the FlexSP scripts) [inferred].",
        licence="Repository Apache-2.0; lengths derived from Wikipedia text (CC BY-SA); only "
        "lengths are kept, no text.",
    ),
    EmpiricalSpec(
        name="wlb-llm",
        filename="distca_dist_wlbllm.json",
        description="DistCA's 'WLB-LLM distribution': 99,519 document lengths of 128K-context "
        "pretraining (max 124,913).",
        provenance="hao-ai-lab/distca @ 039f2e4, distca/simulator/data/dist_wlbllm.json "
        "(sha256 df83913a...).",
        licence="Unclear: README badge says Apache-2.0 but the repository has no LICENSE file "
        "and a vendored setup.py declares MIT.",
        truncation_note=SPLIT_NOTE + " The sample never exceeds 124,913 tokens, so at its "
        "native 128K context no policy changes it.",
    ),
    EmpiricalSpec(
        name="prolong",
        filename="distca_dist_prolong.json",
        description="DistCA's ProLong document-length sample: 77,932 lengths "
        "(min 575, max 340,149).",
        provenance="hao-ai-lab/distca @ 039f2e4, distca/simulator/data/dist_prolong.json "
        "(sha256 7460e6e7...).",
        licence="Unclear: README badge says Apache-2.0 but the repository has no LICENSE file "
        "and a vendored setup.py declares MIT.",
    ),
)

FLEXSP = "FlexSP (arXiv 2412.01523)"
BYTESCALE = "ByteScale (arXiv 2502.21231)"
ASSUMED = "assumption (suite authors)"
# The body spread of the "-like" corpora is not published; 1.4 is Wikipedia's own
# ln(p90 / p50) / z_0.9 = ln(2112 / 347) / 1.2816 (summary_stats.json).
ASSUMED_BODY_SIGMA = 1.4

PARAMETRIC_SPECS: tuple[ParametricSpec, ...] = (
    ParametricSpec(
        name="commoncrawl",
        description="Common-Crawl-like (parametric reconstruction, no raw sample): web pages "
        "with a heavier tail than Wikipedia.",
        provenance="Fitted to: FlexSP's statement that Common Crawl has a heavier tail (more "
        "sequences above 32K) than Wikipedia, whose share above 32K is 0.13% in the FlexSP "
        "sample; median and shares are our assumptions (see fitted_facts).",
        facts=(
            Fact(quantity="median", threshold=0, target=600, source=ASSUMED, published=False),
            Fact(quantity="docs_at_most", threshold=8192, target=0.95,
                 source=ASSUMED + "; FlexSP reports >96% of Wikipedia under 8K", published=False),
            Fact(quantity="docs_at_least", threshold=32769, target=0.005,
                 source=ASSUMED + "; FlexSP: heavier than Wikipedia's 0.13%", published=False),
        ),
        start=SplicedParetoModel(
            mu=math.log(600), sigma=ASSUMED_BODY_SIGMA, breaks=(8192,), cdf_at_breaks=(0.95,),
            alphas=(1.0,), max_length=2**20,
        ),
        free=("mu", "alphas[0]"),
        truncation_note=SPLIT_NOTE,
    ),
    ParametricSpec(
        name="github",
        description="GitHub-like (parametric reconstruction, no raw sample): source files, "
        "heavy tail with many tokens in >128K files.",
        provenance="Fitted to ByteScale's 16.2% of GitHub tokens in sequences longer than 128K "
        "(published) and FlexSP's heavier-than-Wikipedia tail above 32K; median and "
        "shares below 128K are our assumptions (see fitted_facts).",
        facts=(
            Fact(quantity="median", threshold=0, target=800, source=ASSUMED, published=False),
            Fact(quantity="docs_at_most", threshold=8192, target=0.93,
                 source=ASSUMED + "; FlexSP reports >96% of Wikipedia under 8K", published=False),
            Fact(quantity="docs_at_least", threshold=32769, target=0.015,
                 source=ASSUMED + "; FlexSP: heavier than Wikipedia's 0.13%", published=False),
            Fact(quantity="tokens_at_least", threshold=131073, target=0.162, source=BYTESCALE,
                 published=True),
        ),
        start=SplicedParetoModel(
            mu=math.log(800), sigma=ASSUMED_BODY_SIGMA, breaks=(8192,), cdf_at_breaks=(0.93,),
            alphas=(1.0,), max_length=2**21,
        ),
        free=("mu", "alphas[0]", "max_length"),
        truncation_note=SPLIT_NOTE,
    ),
    ParametricSpec(
        name="byted-like",
        description="ByteScale-like extreme production mix (parametric reconstruction): most "
        "samples short, a thin tail up to several million tokens carrying most tokens.",
        provenance="Fitted to ByteScale's published shares: about 80% of samples <= 4K; the 1% "
        ">= 128K carry 44.3% of tokens; the 0.05% >= 2M carry 12.1%. The body below 4K "
        "(lognormal, median 1,000, sigma 1.0) is our assumption.",
        facts=(
            Fact(quantity="docs_at_most", threshold=4096, target=0.80, source=BYTESCALE,
                 published=True),
            Fact(quantity="docs_at_least", threshold=131072, target=0.01, source=BYTESCALE,
                 published=True),
            Fact(quantity="tokens_at_least", threshold=131072, target=0.443, source=BYTESCALE,
                 published=True),
            Fact(quantity="docs_at_least", threshold=2097152, target=0.0005, source=BYTESCALE,
                 published=True),
            Fact(quantity="tokens_at_least", threshold=2097152, target=0.121, source=BYTESCALE,
                 published=True),
        ),
        start=SplicedParetoModel(
            mu=math.log(1000), sigma=1.0, breaks=(4096, 131072), cdf_at_breaks=(0.80, 0.99),
            alphas=(0.8, 1.0), max_length=6e6,
        ),
        free=("alphas[0]", "alphas[1]", "max_length"),
        truncation_note=SPLIT_NOTE + " ByteScale trains at up to 2M context; documents "
        "beyond the chosen context are split.",
    ),
)


def shared_lengths_dir() -> Path:
    """``../shared/length_distributions``; ``SLIMPACK_SHARED_DIR`` may name it or its parent."""
    override = os.environ.get(SHARED_DIR_ENV)
    base = Path(override) if override else REPO_ROOT.parent / "shared"
    nested = base / "length_distributions"
    return nested if nested.is_dir() else base


def build_empirical(spec: EmpiricalSpec, shared_dir: Path) -> Profile:
    data = read_lengths(shared_dir / spec.filename)
    return build_empirical_profile(
        data.lengths,
        name=spec.name,
        description=spec.description,
        provenance=spec.provenance,
        licence=spec.licence,
        truncation_note=spec.truncation_note,
    )


def build_all(shared_dir: Path, out_dir: Path) -> list[Path]:
    if not shared_dir.is_dir():
        raise ValueError(
            f"{shared_dir}: shared length samples not found; set {SHARED_DIR_ENV} or pass "
            "--shared-dir"
        )
    written = [save_profile(build_empirical(s, shared_dir), out_dir / f"{s.name}.json")
               for s in EMPIRICAL_SPECS]
    written += [save_profile(fit_parametric_profile(s), out_dir / f"{s.name}.json")
                for s in PARAMETRIC_SPECS]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "datasets" / "profiles")
    args = parser.parse_args(argv)
    for path in build_all(args.shared_dir or shared_lengths_dir(), args.out):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
