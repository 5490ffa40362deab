"""The tools' libraries: scoring, checkpoint averaging, their shared flags."""
