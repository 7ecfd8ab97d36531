"The `minillm` command line."
import subprocess, sys
from pathlib import Path
import pytest

MINILLM = str(Path(sys.executable).parent / "minillm")

@pytest.mark.parametrize("cmd", ["serve", "generate", "chat", "bench"])
def test_help(cmd):
    out = subprocess.run([MINILLM, cmd, "--help"], capture_output=True, text=True, check=True).stdout
    assert "--max-num-seqs" in out and "--model" in out

def test_generate_streams_the_answer(model_dir):
    out = subprocess.run([MINILLM, "generate", "What is the capital of France?", "--max-tokens", "24", "--model", str(model_dir)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "Paris" in out

def test_chat_reads_turns_until_eof(model_dir):
    out = subprocess.run([MINILLM, "chat", "--max-tokens", "16", "--model", str(model_dir)], input="What is the capital of France?\n",
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "Paris" in out

def test_bad_model_path_is_a_clear_error():
    r = subprocess.run([MINILLM, "generate", "hi", "--model", "/no/such/model"], capture_output=True, text=True)
    assert r.returncode != 0 and "does not exist" in r.stderr
