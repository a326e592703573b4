"""`vlarun layer-importance`: frames drawn from demo shards by slice (every task, all views, the
state), one importance per LM layer, and the removal sets EfficientVLA would use."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from vlarun.sim.layer_table import LayerTableConfig, format_layer_table, run_layer_table


def _shard(path, task: str, n: int = 5) -> None:
    rng = np.random.default_rng(len(task))
    save_file(
        {
            "images": rng.integers(0, 255, (n, 2, 128, 128, 3), dtype=np.uint8),
            "states": rng.normal(size=(n, 4)).astype(np.float32),
            "actions": np.zeros((n, 4), np.float32),
        },
        str(path / f"{task}_000.safetensors"),
        metadata={"task": task, "instruction": f"do {task}"},
    )


def test_layer_table_of_a_two_view_proprio_policy(tmp_path):
    for task in ("reach-v3", "push-v3"):
        _shard(tmp_path, task)
    cfg = LayerTableConfig(policy="mt10p-dit", demos=str(tmp_path), samples=4, remove=3)
    r = run_layer_table(cfg)
    assert r["layers"] == 12 and len(r["importance"]) == 12 and r["samples"] == 4
    assert sorted(r["rank"]) == list(range(1, 13))
    assert [len(v) for v in r["remove"].values()] == [1, 2, 3]
    assert set(r["remove"]["1"]) <= set(r["remove"]["2"]) <= set(r["remove"]["3"])
    assert "remove 3: layers" in format_layer_table(r)
    with pytest.raises(FileNotFoundError, match="no demo shards"):
        run_layer_table(LayerTableConfig(policy="mt10p-dit", demos=str(tmp_path / "none")))
