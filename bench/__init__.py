"""The project's benchmarks: ``python -m bench`` (``make bench``) measures every performance claim.

The issues make claims (a sweep 20x cheaper than the kubernetes client's models, a drain close to
the longest grace period, a migration within 1.2x of its critical path, a cheap cold start). This
package measures each against its natural baseline *in the same run*, so a ratio never compares
numbers taken on different machines or days. One module per benchmark; each exposes
``run(scale) -> list[Figure]``. A benchmark that cannot run (a piece of the app missing, a failure)
reports its figures as "not measured: <why>", never as a number it did not measure.
"""
