"""vlarun against OpenVLA's own predict_action (recorded once by
tests/models/fixtures/record_openvla_reference.py).

The fixture holds what OpenVLA's unmodified ``prismatic/extern/hf`` code (timm 0.9.10,
transformers 4.40.1) produced on a random-weight OpenVLA-layout directory: the greedy action
token ids and the unnormalised actions for three frames of different sizes. The test rebuilds
the very directory (same seed, same SHA-256 of the weights), loads it as any OpenVLA directory
(29871 appended after "Out:", bicubic resize from the processor config, norm_stats from
config.json) and asks for the same outputs.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from vlarun.parity import (
    OPENVLA_REFERENCE_PROMPT,
    make_openvla_reference_dir,
    openvla_reference_frames,
)
from vlarun.policy import Policy

FIXTURE = Path(__file__).parent / "fixtures" / "openvla_reference.json"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("openvla")
    inputs = make_openvla_reference_dir(d)
    fixture = json.loads(FIXTURE.read_text())
    if inputs["weights_sha256"] != fixture["weights_sha256"]:
        pytest.fail(
            "the rebuilt directory's weights differ from the ones OpenVLA ran (torch "
            f"{inputs['torch']} vs the fixture's {fixture['versions']['torch']}): re-record "
            "with tests/models/fixtures/record_openvla_reference.py"
        )
    assert (
        hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
        == (fixture["weights_sha256"])
    )
    return d, fixture, inputs


def test_the_prompt_is_openvla_s(reference):
    d, fixture, inputs = reference
    policy = Policy.from_checkpoint(d)
    # predict_action's input: BOS + the prompt, then 29871 (appended when missing).
    assert [1, *policy.text_ids(OPENVLA_REFERENCE_PROMPT)] == [*fixture["input_ids"], 29871]


def test_same_action_tokens_and_actions_as_openvla_on_frames_of_any_size(reference):
    d, fixture, _ = reference
    policy = Policy.from_checkpoint(d)
    frames = openvla_reference_frames()
    assert [list(f.shape[:2]) for f in frames] == [r["size"] for r in fixture["rows"]]
    for row, frame in zip(fixture["rows"], frames, strict=True):
        out = policy.run_stages(frame, OPENVLA_REFERENCE_PROMPT).outputs["actions"][0]
        normalised = np.asarray(out).reshape(-1)
        ids = np.asarray(policy.model.action_tokenizer.encode(normalised)).reshape(-1)
        assert ids.tolist() == row["action_ids"], f"frame {row['size']}"
        actions = np.asarray(policy.unnormalize(out)).reshape(-1)
        np.testing.assert_allclose(actions, row["actions"], atol=1e-5, rtol=0)
