"""Process runtime: thread pools sized once per process, the matrix-product precision that really runs, devices,
and the cache folder. The one part of ``lens`` that ``geometry`` and ``probes`` may use besides errors, site names
and the store's views and sums; nothing here sees a model."""
