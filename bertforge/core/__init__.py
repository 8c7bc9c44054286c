"""Foundations: the error type, shared constants, files, activations, dense-layer kernels, the runtime set-up, settings declared once, resumable state."""
