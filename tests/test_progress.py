"""`jaxroof.progress`: a bar only on a terminal, never in tests or pipes."""

import io

from jaxroof import progress


class _Terminal(io.StringIO):

  def isatty(self) -> bool:
    return True


def test_a_terminal_gets_a_bar_with_the_time_left(monkeypatch):
  monkeypatch.delenv(progress.ENV_OFF, raising=False)
  stream = _Terminal()
  assert list(progress.bar(range(3), desc="work", stream=stream)) == [0, 1, 2]
  text = stream.getvalue()
  assert "work" in text and "<" in text  # tqdm's [elapsed<remaining].


def test_pipes_the_flag_and_the_env_var_turn_it_off(monkeypatch):
  monkeypatch.delenv(progress.ENV_OFF, raising=False)
  pipe = io.StringIO()
  assert list(progress.bar(range(3), desc="work", stream=pipe)) == [0, 1, 2]
  assert pipe.getvalue() == ""
  assert not progress.enabled(False, _Terminal())
  monkeypatch.setenv(progress.ENV_OFF, "1")
  quiet = _Terminal()
  list(progress.bar(range(3), desc="work", stream=quiet))
  assert quiet.getvalue() == "" and not progress.enabled(True, _Terminal())
