"""One cell's training, below the grid that runs it (abl.run).

The loop (loop: prepare, begin, train_loop, post-training), what a run holds
(state: ``TrainingRun``, the metric sink, ``Diverged``), the optimizer and
schedule (optim), checkpoints (checkpoint), what the run measures about itself:
costs, memory, the machine's share, MFU (measure), several processes (ddp),
``train.compile`` (compiled), the post-training evaluations (evaluations),
task batches and accuracy (taskdata) and ``val_bpb`` on the same byte spans
under every tokenizer (spanscore). May import ``abl.store`` and the layers
below it; nothing here knows a grid.
"""
