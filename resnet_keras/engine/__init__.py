"""The parts a run is built from, the same for training and for the tools
that rebuild a run's model; when each acts is training/'s.

  assembly.py     the parts built from a RunConfig, for training and tools
  runtime.py      the process set up: threads, XLA, seeds, precision policy
  distribution.py the job's workers: one Backend over tf.distribute and
                  Horovod
  start.py        where a run starts (fresh, resumed, warm), decided once
                  and restored
  world.py        the job's shape from each start: where a resumed run's
                  data goes on
  objective.py    what a step computes: forward pass, losses, gradients
  step_record.py  what a step leaves for the host: the LoopRecord
  trainer.py      the training loop orbit runs (StandardTrainer)
  evaluator.py    evaluation (StandardEvaluator): metrics, flip TTA, the
                  weight average swapped in
  metrics.py      a loop's readout: log lines, metrics.jsonl
  guards.py       what stops a loop: signals, the stop poll, the finite check
"""
