"""The K2.6 cost emulator: the proving ground's target made to cost the GPU what one rank of a real
K2.6 box spends on the same step (calibration.py: the cost model and its fit to the field's figures;
wait.py: the wait computed and spun on the device; model.py: the SGLang model class that adds it;
folder.py: a trained target folder turned into an emulated one). SGLang loads model.py through
SGLANG_EXTERNAL_MODEL_PACKAGE=proving_ground.emulator, which imports every module here."""
