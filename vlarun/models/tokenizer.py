"""Instruction tokenizers: a byte-level fallback and Hugging Face ``tokenizer.json`` files.

Random-weight presets need no vocabulary, so they use UTF-8 bytes. A trained checkpoint ships its
own ``tokenizer.json`` (loaded with the ``tokenizers`` library, no hub access), and that is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

BOS_ID = 1  # Llama convention: 0 unk/pad, 1 <s>, 2 </s>
EOS_ID = 2
PAD_ID = 0


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt template (prismatic ``PurePromptBuilder`` for the v01-less models)."""
    return f"In: What action should the robot take to {instruction.strip().lower()}?\nOut:"


def task_newline_prompt(instruction: str, state=None) -> str:
    """PaliGemma's prompt as LeRobot's pi0 builds it: the task as given, ending in a newline."""
    return instruction if instruction.endswith("\n") else instruction + "\n"


def _task_and_state(instruction: str, state, model: str) -> str:
    """The text "Task: ..., State: ...;\n" as LeRobot's pi05 and pi0_fast write it: the task and
    the normalised state in 256 bins over [-1, 1] (values outside fall to -1 or 255 as
    ``np.digitize`` puts them), the task cleaned as they clean it."""
    import numpy as np

    if state is None:
        raise ValueError(f"{model} writes the robot state into its prompt: pass the state")
    bins = np.digitize(np.asarray(state), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    task = instruction.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {task}, State: {' '.join(map(str, bins.reshape(-1)))};\n"


def pi05_prompt(instruction: str, state=None) -> str:
    """pi05's prompt (LeRobot ``Pi05PrepareStateTokenizerProcessorStep``), e.g. "Task: pick up
    the cup, State: 128 3 255;\nAction: "."""
    return _task_and_state(instruction, state, "pi05") + "Action: "


def pi0_fast_prompt(instruction: str, state=None) -> str:
    """pi0_fast's prompt (LeRobot ``Pi0FastPrepareStateAndLanguageTokenizerProcessorStep``):
    pi05's without "Action: ", which the model writes itself before its FAST code."""
    return _task_and_state(instruction, state, "pi0_fast")


def _openvla(instruction: str, state=None) -> str:
    return openvla_prompt(instruction)


def llava_prompt(instruction: str, state=None) -> str:
    """LLaVA-1.5's turn asking for the action, ``<image>`` included (models/llava.py splits the
    ids there: the patch features take its place)."""
    task = instruction.strip().lower()
    return f"USER: <image>\nWhat action should the robot take to {task}? ASSISTANT:"


def univla_prompt(instruction: str, state=None) -> str:
    """UniVLA's text: the instruction as given after BOS (its LIBERO evaluation,
    ``model_wrapper_emu.py``: ``bos_token + prompt``)."""
    return instruction


# Prompt templates by the name a Policy records (the one its checkpoint was trained with); each
# takes the instruction and the normalised state (which pi05's and pi0_fast's write into the
# text).
PROMPTS = {
    "openvla": _openvla,
    "task-newline": task_newline_prompt,
    "pi05": pi05_prompt,
    "pi0_fast": pi0_fast_prompt,
    "llava": llava_prompt,
    "univla": univla_prompt,
}


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids without BOS."""
        ...


class ByteTokenizer:
    """UTF-8 bytes shifted past the special ids: id = 3 + byte."""

    OFFSET = 3

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < self.OFFSET + 256:
            raise ValueError(f"a byte tokenizer needs vocab_size >= 259, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.OFFSET + b for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < self.OFFSET + 256)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` shipped beside the weights."""

    def __init__(self, path: str | Path, bos_id: int | None = BOS_ID) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "this checkpoint ships tokenizer.json: pip install tokenizers"
            ) from e
        self._tok = _Tok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        # The model adds BOS itself, so a stray one here is dropped; a model without one
        # (bos_id None: SmolVLA) takes the tokenizer's own special tokens, as LeRobot does.
        self.bos_id = bos_id

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary (e.g. LLaVA's ``<image>``), None if absent."""
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        if self.bos_id is None:
            return self._tok.encode(text, add_special_tokens=True).ids
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [i for i in ids if i != self.bos_id]


def load_tokenizer(
    directory: str | Path | None, vocab_size: int, bos_id: int | None = BOS_ID
) -> Tokenizer:
    """The checkpoint's tokenizer.json when present, else the byte-level fallback."""
    if directory is not None and (Path(directory) / "tokenizer.json").exists():
        return HFTokenizer(Path(directory) / "tokenizer.json", bos_id)
    return ByteTokenizer(vocab_size)
