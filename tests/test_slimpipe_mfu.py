"""The slimpipe-mfu claims' measured analysis (repro/experiments/slimpipe_mfu.py)."""

from __future__ import annotations

import json

import pandas as pd

from repro.experiments.slimpipe_mfu import claims, gap_notes

PAR = json.dumps({"tp": 2, "cp": 8, "pp": 4, "vpp": 5, "dp": 2})
MOVED = {"pairs": 10, "moved_s": 100.0, "added_s": 100.0, "transfer_s": 16.0,
         "fwd_imbalance_before": 1.36, "fwd_imbalance_after": 1.002,
         "bwd_imbalance_before": 1.38, "bwd_imbalance_after": 1.0016}


def _row(method: str, mfu: float, *, context: int = 512 * 1024, gpus: int = 128,
         bubble: float = 0.02, recompute: str = "none", offload: float = 0.0,
         extra: dict | None = None) -> dict:
    return {"method": method, "model": "llama-70b", "context": context, "num_gpus": gpus,
            "mfu": mfu, "bubble_fraction": bubble, "recompute": recompute,
            "offload": offload, "oom": False, "parallel": PAR,
            "extra": json.dumps(extra or {})}


def test_gap_note_reports_the_ratio_and_what_would_close_it():
    records = pd.DataFrame([
        _row("slimpipe", 0.60, bubble=0.014, offload=1.0, extra={"attention_redistribution":
                                                                   MOVED}),
        _row("megatron-1f1b", 0.46, recompute="full"),
        _row("megatron-interleaved", 0.50, recompute="full"),
        _row("slimpipe", 0.59, context=2048 * 1024, gpus=256, offload=1.0),
    ])
    gain, long = gap_notes(records)
    assert "Their ratio is 1.20x" in gain  # 0.60 / 0.50, the better Megatron-LM
    assert "megatron-interleaved" in gain
    assert "Megatron-LM at 38.2% MFU" in gain  # 60 / 1.57
    assert "SlimPipe at 78.5%" in gain  # 50 * 1.57
    assert "from 1.36 to 1.002" in gain and "transfers 16% of the" in gain
    assert "idle only 1.4%" in gain
    assert long.startswith("SlimPipe at 2048K: 59.0% MFU at tp2 cp8 pp4 vpp5 dp2")
    by_id = {c.claim_id: c for c in claims(records)}
    assert by_id["mfu-gain-512k-70b"].analysis == gain
    assert by_id["mfu-2048k-70b"].reproduced == 59.0


def test_gap_note_empty_without_records():
    assert gap_notes(pd.DataFrame()) == ("", "")
