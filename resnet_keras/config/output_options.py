"""What a run writes (OutputConfig): model_dir, checkpoints, summaries,
profiles and trackers; with its own checks."""

import dataclasses
from typing import Optional, Tuple

from resnet_keras import files
from common.errors import UsageError
from resnet_keras.config.options import check_fields, option


def _format_pair(steps: Optional[Tuple[int, int]]) -> Optional[str]:
  return steps and ','.join(map(str, steps))


def _parse_pair(text: Optional[str]) -> Optional[Tuple[int, int]]:
  """--profile_steps's "start,stop" (its range is checked with the rest)."""
  if not text:
    return None
  try:
    start, stop = (int(p) for p in text.split(','))
  except ValueError:
    raise UsageError(f'--profile_steps must be "start,stop" (two integers), '
                     f'got "{text}"') from None
  return start, stop


# What a run writes inside model_dir, at most, with room to spare: an
# export's variables (exports/ckpt-N/feature_vector/variables/variables.
# data-00000-of-00001, 77 characters), TensorFlow's temporary checkpoint
# names, W&B's files.
_MODEL_DIR_ROOM = 160


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """What a run writes: model_dir, checkpoints, summaries."""
  model_dir: str = option(
      '',
      'Checkpoints, summaries, exports and run_summary.json; a rerun with '
      'the same model_dir resumes. Empty: a new private directory for this '
      'run alone (tempfile.mkdtemp, named in the log), never a shared '
      'default; a job of several workers must name one.', alias='md',
      path=True)
  clean: bool = option(
      False,
      'Remove what runs wrote in model_dir before training: the files and '
      'folders of docs/run_directory.md, never anything else; a model_dir '
      'that holds anything else is refused before any work, nothing '
      'removed (the directory itself stays). Under the launcher it applies to '
      'the first attempt only: a restarted one (--max_restarts, an elastic '
      'job) resumes from the checkpoints the first wrote.')
  enable_checkpoint_and_export: bool = option(
      False,
      'Checkpoint every epoch and export a SavedModel to '
      'model_dir/saved_model at the end.')
  checkpoint_interval_steps: int = option(
      0,
      'With --enable_checkpoint_and_export: also checkpoint every N '
      'steps; 0: at every epoch end only.',
      within='>= 0')
  checkpoint_interval_seconds: float = option(
      0.0,
      'With --enable_checkpoint_and_export: also checkpoint at the first '
      'loop boundary this many seconds after the last checkpoint. 0: '
      'chosen by the run to lose least to failures, sqrt(2 x a save\'s '
      'stall x the job\'s mean time between failures) within [10 s, 30 '
      'min] (about 10 s for a job killed every 2 minutes, 40 s for one '
      'that never failed; docs/training.md). A value above the run\'s '
      'length saves by steps and epochs alone.',
      within='>= 0')
  max_checkpoints: int = option(
      5,
      'Checkpoints kept in model_dir (oldest deleted first).',
      within='> 0')
  enable_tensorboard: bool = option(
      False,
      'Write TensorBoard summaries to model_dir/train and '
      'model_dir/eval.')
  plots: bool = option(
      True,
      'The chief draws model_dir/plots/*.png from metrics.jsonl at the end '
      'of the run (about a second: matplotlib); --noplots skips them, and '
      'python -m resnet_keras.plots MODEL_DIR draws them at any time.')
  profile_steps: Optional[Tuple[int, int]] = option(
      None,
      '"start,stop": write a TensorBoard profile of these global steps '
      'to model_dir/profile.',
      parse=_parse_pair, text=_format_pair)
  wandb: bool = option(
      False,
      "Also log metrics.jsonl's records and the config to Weights & "
      'Biases (pip install wandb); offline, under model_dir/wandb, when '
      'not logged in or offline.')
  wandb_project: str = option(
      'resnet_keras',
      'W&B project of --wandb.')
  wandb_run_name: Optional[str] = option(
      None,
      'W&B run name of --wandb; default: W&B picks one.')

  def _check_output(self) -> None:
    check_fields(self, OutputConfig)
    if self.model_dir:
      files.check_path_length('--model_dir', self.model_dir, _MODEL_DIR_ROOM)
    if self.profile_steps is not None:
      start, stop = self.profile_steps
      if not 0 <= start < stop:
        raise UsageError('--profile_steps must be "start,stop" with '
                         f'0 <= start < stop, got {start},{stop}')
