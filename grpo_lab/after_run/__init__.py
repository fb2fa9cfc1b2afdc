"""Stage 4, after a run: metrics, the health report, the sweep summary and the failure doctor.
"""
