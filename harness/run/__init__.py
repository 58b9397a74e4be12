"""Running a grid: orchestration, executors, workers, progress.

The runner plans and resumes a grid and ingests as cells finish (runner), and
shows its progress (progress, estimate), the executors place cells in
processes, on Slurm or on Ray (executors, zygote, worker), each worker gets
its threads (threads), the learning-rate sweep (lr_sweep), memory admission
(admission), preflight checks (preflight) and compile payback before a grid
starts (payback). One cell's training is abl.train, the layer below. May
import ``abl.present`` and the layers below it.
"""
