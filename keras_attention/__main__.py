import sys

from keras_attention.cli import main

sys.exit(main())
