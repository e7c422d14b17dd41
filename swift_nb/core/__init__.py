"""The ground floor every layer may import, importing none of them: errors, units, device
presets, the options of a profiled run, the GC pause, and how torch.profiler names things
(``trace_names``) with the interval arithmetic over its spans (``intervals``)."""
