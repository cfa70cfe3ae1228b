"""The EIT protocol and image grid shared by every module: 16 electrodes, adjacent current
injection and adjacent voltage measurement with the pairs touching the injecting electrodes
left out (13 per injection, 208 in all), and 128 x 128 images (`reference/eit-conventions.md`)."""

NUM_ELECTRODES = 16
MEAS_PER_INJECTION = NUM_ELECTRODES - 3                  # 13
NUM_MEASUREMENTS = NUM_ELECTRODES * MEAS_PER_INJECTION  # 208
STATS_SHAPE = (1, NUM_ELECTRODES, MEAS_PER_INJECTION)   # the authors' mean/std layout
IMAGE_SIZE = 128
