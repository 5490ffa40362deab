"""RunConfig: the one object everything downstream of the flags reads, and
the one place each option is declared.

Each field is declared once, with `options.option(default, help, ...)`: its
choices or range, its short flag and its help live beside its default, and
flags.py, the checks (`RunConfig.check`) and --print_config are derived
from it. The fields come in groups by concern, one frozen dataclass each,
declared with their choices and checking their own fields in this
package's modules:

- data_options.py: DataConfig, AugmentationConfig, DataServiceConfig;
- model_options.py: ModelConfig, WarmStartConfig;
- runtime_options.py: PrecisionConfig, RuntimeConfig;
- training_options.py: LoopConfig, OptimizerConfig, ScheduleConfig,
  LossConfig;
- output_options.py: OutputConfig.

RunConfig, here, inherits them all into one flat record (code reads
`cfg.image_size`; config.json stays one flat object) and holds only the
rules that relate several groups. (The recipes that fill them in,
`--config NAME`, are the YAML files of resnet_keras/configs/ beside this
package, read by recipes.py.)

Beside the groups, what declares, reads and resolves them:

- options.py: the declaration, `option(...)`, and the checks it gives;
- flags.py: every field a flag. Entry points parse flags once
  (`config_from_flags`); the library only sees a frozen RunConfig, so tests
  build configs directly and no module reads absl's FLAGS;
- recipes.py: `--config`, a recipe read and applied;
- plan.py: TrainingPlan, the batch and step arithmetic on a job's layout;
- hardware.py: what the machine can do, and what each 'auto' becomes on it;
- channels.py: the stages' channel counts (--stage_widths' default, the
  network's);
- randaugment_spec.py: --randaugment's grammar, checked here and applied by
  data/.
"""

import dataclasses
from typing import Any, Dict, Tuple, Type, TypeVar

from common.errors import UsageError
from resnet_keras.config.data_options import (AugmentationConfig, DataConfig,
                                              DataServiceConfig)
from resnet_keras.config.model_options import ModelConfig, WarmStartConfig
from resnet_keras.config.output_options import OutputConfig
from resnet_keras.config.runtime_options import PrecisionConfig, RuntimeConfig
from resnet_keras.config.training_options import (LoopConfig, LossConfig,
                                                  OptimizerConfig,
                                                  ScheduleConfig)

# The groups in the order the data flows: --print_config (and asdict) list
# the fields in this order.
GROUPS = (DataConfig, AugmentationConfig, DataServiceConfig, ModelConfig,
          WarmStartConfig, PrecisionConfig, LoopConfig, OptimizerConfig,
          ScheduleConfig, LossConfig, OutputConfig, RuntimeConfig)


# Bases in reverse: a dataclass lists its bases' fields from the last base
# to the first.
@dataclasses.dataclass(frozen=True)
class RunConfig(*reversed(GROUPS)):
  """Everything a run needs: one flat, frozen record of every group's
  fields, and the rules that relate groups."""

  @property
  def resize_epochs(self) -> Tuple[int, int]:
    """Progressive resizing's epochs, (first, last) counted from 0."""
    return self.progressive_resize_epochs or (0, max(self.train_epochs - 1,
                                                     0))

  def check(self) -> None:
    """Raises UsageError naming the first bad value and what is allowed."""
    self._check_data()
    self._check_augmentation()
    self._check_data_service()
    self._check_keras_application()  # Before the model's own checks.
    self._check_model()
    self._check_warm_start()
    self._check_precision()
    self._check_loop()
    self._check_optimizer()
    self._check_schedule()
    self._check_loss()
    self._check_output()
    self._check_runtime()
    self._check_across_groups()

  def _check_keras_application(self) -> None:
    """A keras.applications backbone is fixed: the options that change
    this project's ResNets (model, initialisation) do not apply."""
    if self.keras_applications_model is not None:
      for name, wished in (('norm=group', self.norm == 'group'),
                           ('sync_batch_norm', self.sync_batch_norm),
                           ('enable_recompute', self.enable_recompute),
                           ('zero_init_residual', self.zero_init_residual),
                           ('blurpool', self.blurpool),
                           ('stem_init=pca', self.stem_init == 'pca'),
                           ('drop_path_rate', self.drop_path_rate > 0),
                           ('width_multiplier', self.width_multiplier != 1),
                           ('stage_widths', bool(self.stage_widths))):
        if wished:
          raise UsageError(f'--{name} applies to this project\'s ResNets; '
                           '--keras_applications_model backbones are fixed '
                           '(drop one of the two flags)')

  def _check_across_groups(self) -> None:
    if self.single_l2_loss_op and self.uses_adam:
      raise UsageError(f'--single_l2_loss_op is an L2 loss term of SGD and '
                       f'RMSProp; {self.optimizer} decays the weights inside '
                       'the optimizer (drop --single_l2_loss_op)')
    if self.loss == 'bce' and self.enable_recompute:
      raise UsageError('--loss=bce trains on the logits of a view of the '
                       'network that --enable_recompute\'s model does not '
                       'have: drop one of the two flags')
    if self.stem_init == 'pca' and self.use_synthetic_data:
      raise UsageError('--stem_init=pca starts the stem from training '
                       'images, which --use_synthetic_data has none of: drop '
                       'one of the two flags')
    for name in ('image_size', 'eval_image_size',
                 'progressive_resize_start_size'):
      size = getattr(self, name)
      if size == 0 and name != 'image_size':  # 0: not set
        continue
      if size < self.min_image_size:
        raise UsageError(
            f'--{name}={size} is too small for ResNet with '
            f'--stem={self.stem}: it downsamples by {self.min_image_size}, '
            f'use --{name} >= {self.min_image_size} (or a stem that '
            'downsamples less)')
    if self.tf_data_service and self.skip_corrupt_records:
      raise UsageError('--skip_corrupt_records counts skipped records in the '
                       'trainer, which a tf.data service worker cannot do: '
                       'drop one of it and --tf_data_service')
    if self.tf_data_service and self.use_synthetic_data:
      raise UsageError('--use_synthetic_data makes its batches in the '
                       'trainer; --tf_data_service serves real data: drop '
                       'one of them')


_Record = TypeVar('_Record')


def from_dict(cls: Type[_Record], values: Dict[str, Any]) -> _Record:
  """Rebuilds a RunConfig or TrainingPlan from `dataclasses.asdict` JSON.

  Keys the class no longer has are ignored and missing ones take their
  defaults, so a model_dir written by another version still loads. JSON has
  no tuples; these classes hold no lists, so lists become tuples again.
  """
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: tuple(v) if isinstance(v, list) else v
                for k, v in values.items() if k in names})
