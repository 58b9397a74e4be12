"""The model and what it costs: the shared decoder skeleton, decoding, cost model, budget matching.

The decoder-only skeleton that asks the registry for every part (decoder) and its LM
head's options in one object (head: embedding scale, tying, logit scale, soft cap, z-loss), cached
decoding and length extrapolation (decode), the analytic cost model (costmodel)
and budget matching of cells to a common cost (matching), the measured side of
memory and FLOPs (memory, flops) and the compiled-shape cache (shapecache). May
import ``abl.data`` and the layers below it.
"""
