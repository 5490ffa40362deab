"""How the weights move.

  optimizers.py    SGD, LARS, RMSProp, AdamW and LAMB, each with its
                   weight-decay path; gradient clipping, fp16's loss scaling
  lr_schedules.py  the learning rate over the run: warmup, then the decay
                   --lr_schedule names
  ema.py           the weight average kept beside the weights (--ema_decay)
"""
