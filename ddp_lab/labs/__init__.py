"""The chapters' experiments and demos: what a lesson runs to show something happen.

Not for reading first (that is the teaching code at ``ddp_lab/``'s top); each module names the
chapter that runs it. Stored real runs (``*_run.json``) lie next to the module that wrote them.
"""
