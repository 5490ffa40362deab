"""The run directory (--model_dir) and who may write there.

  run_directory.py  every file and folder a run writes, named once, and the
                    one reading of its latest checkpoint
  run_lock.py       one writer at a time: the lock file and its holder
  ownership.py      who holds the directory and what in it is a run's
                    (what --clean removes)
  checkpoints.py    checkpoints written, found and restored

The trainer, the tools and the launcher go through it
(docs/run_directory.md).
"""
