"""Library errors name the flag a user typed: `_cli.FIELD_FLAGS` and `_cli.error_line`."""

from __future__ import annotations

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
from absl.testing import parameterized

from experiments import _cli
from experiments import _layout_flags
from jaxroof.errors import InputError
from jaxroof.errors import require_positive_ints


def _flag_values(*argv: str) -> flags.FlagValues:
  """A private set of flags, as an experiment with these would define, parsed from argv."""
  values = flags.FlagValues()
  flags.DEFINE_integer("tp", 1, "", flag_values=values)
  flags.DEFINE_float("token_gap_ms", None, "", flag_values=values)
  flags.DEFINE_float("batch_window_ms", 50.0, "", flag_values=values)
  flags.DEFINE_list("batch_sizes", "1,2", "", flag_values=values)
  values(["prog", *argv])
  return values


class ErrorLineTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("same_name", InputError("tp=3 is not allowed: 3 does not divide 32 heads.", field="tp"),
       ("--tp=3",), "--tp=3 is not allowed: 3 does not divide 32 heads."),
      ("other_unit", InputError("token_gap_s=0.0005 is below one step.", field="token_gap_s"),
       ("--token_gap_ms=0.5",), "--token_gap_ms=0.5: token_gap_s=0.0005 is below one step."),
      ("second_candidate", InputError("batching_window=-1 ...", field="batching_window"),
       ("--batch_window_ms=7",), "--batch_window_ms=7.0: batching_window=-1 ..."),
      ("list_element", InputError("batch_sizes[1]=0 is not allowed.", field="batch_sizes[1]"),
       ("--batch_sizes=4,0",), "--batch_sizes=4,0: batch_sizes[1]=0 is not allowed."),
      ("no_such_flag", InputError("rope_base=-1 is not allowed.", field="rope_base"),
       (), "rope_base=-1 is not allowed."),
      ("no_field", InputError("two devices named: give one."),
       ("--tp=2",), "two devices named: give one."),
      ("names_a_flag_already", InputError("--tp=2 contradicts --chips=3.", field="tp"),
       ("--tp=2",), "--tp=2 contradicts --chips=3."),
  )
  def test_names_the_flag(self, error, argv, expected):
    self.assertEqual(_cli.error_line(error, _flag_values(*argv)), expected)

  def test_a_library_check_maps_to_its_list_flag(self):
    with self.assertRaises(InputError) as raised:
      require_positive_ints("batch_sizes", [4, -2])
    line = _cli.error_line(raised.exception, _flag_values("--batch_sizes=4,-2"))
    self.assertTrue(line.startswith("--batch_sizes=4,-2: batch_sizes[1]=-2"), line)


class LayoutFlagsTest(parameterized.TestCase):
  """The shared layout flags, set as a user would (`flagsaver`)."""

  @parameterized.named_parameters(
      ("zero_tp", dict(tp=0), "--tp=0"),
      ("negative_dp", dict(dp=-1), "--dp=-1"),
      ("zero_chips", dict(chips=0), "--chips=0"),
  )
  def test_bad_degree_names_its_flag(self, overrides, needle):
    with flagsaver.flagsaver(**overrides):
      with self.assertRaises(InputError) as raised:
        _layout_flags.layout()
    self.assertIn(needle, _cli.error_line(raised.exception))

  @flagsaver.flagsaver(tp=2, dp=3)
  def test_layout_multiplies_the_degrees(self):
    layout = _layout_flags.layout()
    self.assertEqual((layout.tp, layout.dp, layout.chips), (2, 3, 6))

  @flagsaver.flagsaver(chips=4)
  def test_chips_alone_is_tensor_parallel(self):
    self.assertEqual(_layout_flags.layout().tp, 4)


if __name__ == "__main__":
  absltest.main()
