"""A training run over time: when things happen, what it reports, its end.

  run.py            one run: set up -> start -> assemble -> restore -> loop
                    -> finish; it owns *when* (the parts are engine/'s)
  reporting.py      what the run reports: log lines, evaluations,
                    TensorBoard, the profile, run_summary.json
  curves.py         metrics.jsonl drawn as plots/ (also the plots tool's)
  tracking.py       --wandb: the metrics mirrored to Weights & Biases
  goodput.py        each attempt's timings and the job's goodput over them
  job_starts.py     a Slurm job's starts and stops (scheduler.json)
  watchdog.py       a thread that ends a wait on frozen workers too long
  stuck_workers.py  the watchdog wired into a run
  slow_workers.py   a worker slower than the others, named
  timed_saves.py    checkpoints by time: the interval that loses least
  final_export.py   the export at the run's end (model_dir/saved_model)
"""
