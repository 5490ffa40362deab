"""The reference's optimizer presets (`--optimizer LARS` / `SGD`): written
once, in the recipes that hold the reference's values; the launcher takes
an optimizer's settings from them and the docs' table is made from here
(docs/multi_host.md, kept equal by a unit test).

LARS's base learning rate was tuned for one worker (2.5) and for the
8-worker global batch (9.5). RMSProp has no reference recipe: the trainer's
flags as given.
"""

from typing import Any, Dict, Tuple

from resnet_keras.config import recipes

# optimizer -> (the settings it presets, the recipe of one worker, the
# recipe of several).
_PRESETS: Dict[str, Tuple[Tuple[str, ...], str, str]] = {
    'LARS': (('base_learning_rate', 'warmup_epochs', 'lr_schedule',
              'label_smoothing', 'weight_decay', 'single_l2_loss_op'),
             'resnet50_lars_1worker', 'resnet50_lars_8workers'),
    # The Model Garden's 90-epoch recipe, whatever the worker count.
    'SGD': (('base_learning_rate', 'warmup_epochs', 'lr_schedule',
             'weight_decay'),
            'resnet50_sgd_90epochs', 'resnet50_sgd_90epochs'),
}


def preset(optimizer: str, total_workers: int) -> Dict[str, Any]:
  """The settings `--optimizer` presets for a job of `total_workers`."""
  if optimizer not in _PRESETS:
    return {}
  keys, one, several = _PRESETS[optimizer]
  recipe = recipes.load(recipes.resolve(one if total_workers == 1 else
                                        several))
  return {key: recipe[key] for key in keys}


def markdown_table() -> str:
  """Each preset's settings for one worker and for several, as the docs
  quote them."""
  rows = ['| `--optimizer` | one worker | several workers |', '|---|---|---|']
  for optimizer in _PRESETS:
    cells = [' '.join(recipes.as_args(preset(optimizer, workers)))
             for workers in (1, 2)]
    rows.append(f'| {optimizer} | `{cells[0]}` | `{cells[1]}` |')
  return '\n'.join(rows)
