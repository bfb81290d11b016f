"""Tools a learner runs on their own machine and jobs: the doctor (``dl.doctor()``), the
training program (``python -m ddp_lab.tools.train``), checkpoints, data, error reports, rank
arithmetic and trace analysis."""
