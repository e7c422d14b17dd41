"""The rules about memory the run holds without using it: models left alive in the kernel."""
