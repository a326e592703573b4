"""`--server-key edge.key` as the README writes it: a bare name is found where `vlarun keys`
wrote it (issue 45, 7: it failed unless run from ~/.config/vlarun/keys)."""

import pytest

from vlarun.runtime.transport import generate_keys, load_keys


def test_a_bare_key_name_is_found_in_the_default_key_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VLARUN_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.chdir(tmp_path)
    generate_keys(tmp_path / "keys", "edge")
    assert load_keys("edge.key").public
    assert load_keys("edge.key_secret").secret
    with pytest.raises(FileNotFoundError, match="here or in .*keys"):
        load_keys("robot9.key")
