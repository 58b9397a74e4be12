"""Running a grid: orchestration, executors, workers, the training loop, evaluations.

The runner plans and resumes a grid and ingests as cells finish (runner), and
shows its progress (progress), the executors place cells in processes, on
Slurm or on Ray (executors, zygote, worker), one cell trains (train: the loop;
optim: optimizer and schedule; checkpoint; measure: costs, memory, MFU; ddp;
compiled) and is evaluated (evaluations, taskdata; spanscore: val_bpb on the
same byte spans under every tokenizer), the learning-rate sweep
(lr_sweep), memory admission (admission) and preflight checks (preflight). May
import ``abl.present`` and the layers below it.
"""
