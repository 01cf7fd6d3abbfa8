"""Evaluation: eval sets, text normalisation and WER, TTS audio."""
