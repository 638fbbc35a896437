"""The paper's models: the policy (HF transformers classes) with taps, and the three draft families.

policy.py   build_policy / load_policy, the Policy wrapper (taps, ragged-cache decode step)
taps.py     TapSpec (both tap-index conventions), TapRecorder hooks
"""
