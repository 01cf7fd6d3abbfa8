"""Distillation that sits above the lanes: it reads eval data, synthesizes speech and trains,
so it imports asr/, eval/ and training.py, and nothing below imports it. ``asr``: the vocab
diet's recovery and the draft decoder. (The SA3 stages live with their model in diffusion/.)"""
