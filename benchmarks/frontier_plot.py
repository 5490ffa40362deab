"""The Fashion-MNIST frontier as a picture: test accuracy against wall time.

  python -m benchmarks.frontier_plot --runs_dir /tmp/time_to_accuracy \
      [--rows 'baseline,fast +pca_stem,fashion_mnist_94'] \
      [--out benchmarks/fashion_mnist_frontier.png]

Reads the run summaries time_to_accuracy.py left in --runs_dir (one
ROW_sSEED directory per run) and draws each seed as a dot and each row's
mean as a labelled cross, wall time (training and evaluations) on x.
"""

import argparse
import glob
import json
import os
from typing import Dict, List, Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def read_runs(runs_dir: str, row: str) -> List[Tuple[float, float]]:
  """(wall seconds, top-1 %) of each seed's run of `row`."""
  runs = []
  for path in sorted(glob.glob(os.path.join(runs_dir, f'{glob.escape(row)}'
                                            '_s*', 'run_summary.json'))):
    with open(path) as f:
      summary = json.load(f)
    runs.append((summary['wall_seconds'], 100 * summary['eval_accuracy']))
  return runs


def draw(rows: Dict[str, List[Tuple[float, float]]], title: str,
         out: str) -> None:
  figure = Figure(figsize=(7, 4.5))
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  for i, (row, runs) in enumerate(rows.items()):
    colour = f'C{i}'
    axes.scatter(*zip(*runs), color=colour, alpha=0.4, s=18)
    mean = (sum(r[0] for r in runs) / len(runs),
            sum(r[1] for r in runs) / len(runs))
    axes.scatter(*mean, color=colour, marker='x', s=80,
                 label=f'{row}: {mean[1]:.2f}% in {mean[0]:.0f} s')
  axes.set_xlabel('wall time, s (training and evaluation)')
  axes.set_ylabel('test top-1, %')
  axes.set_title(title)
  axes.grid(alpha=0.3)
  axes.legend(loc='best', fontsize=8)  # Away from the points.
  figure.tight_layout()
  figure.savefig(out, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs_dir', required=True,
                      help="time_to_accuracy.py's --out_dir.")
  parser.add_argument('--rows', default='baseline,fast +pca_stem,'
                      'fashion_mnist_94')
  parser.add_argument('--title', default='Fashion-MNIST: accuracy against '
                      'time')
  parser.add_argument('--out', default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)),
      'fashion_mnist_frontier.png'))
  args = parser.parse_args()
  rows = {row: read_runs(args.runs_dir, row) for row in args.rows.split(',')}
  missing = [row for row, runs in rows.items() if not runs]
  if missing:
    raise SystemExit(f'no runs of {missing} in {args.runs_dir}')
  draw(rows, args.title, args.out)
  print(args.out)


if __name__ == '__main__':
  main()
