"""Stage 2, the checks before Ray starts: the preflight's rules and their re-checked fixes, the files and the machine a
job needs, the reward probe, the emulation of a smaller card, and the fit that searches settings that fit.
"""
