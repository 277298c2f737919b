"""`TranslatorExport`: a translator's SavedModels (the whole decoding, or
Keras's `export` of the teacher-forced model)."""

import keras


class TranslatorExport:
    """`export_generator`, and Keras's `export` with the inputs' signature
    filled in (a subclassed translator records no input shapes, so Keras
    said it had "never [been] called")."""

    def export(self, filepath, format="tf_saved_model", verbose=None,
               input_signature=None, **kwargs):
        """Keras's `export` of the teacher-forced model, `{"source_ids":
        (B, S), "target_ids": (B, T)}` -> logits `(B, T, vocabulary)`; the
        signature defaults to int32 ids of the preprocessor's lengths. To
        serve translations, `export_generator`."""
        if input_signature is None:
            p = self.preprocessor
            input_signature = [{
                "source_ids": keras.InputSpec(
                    shape=(None, p.source_length), dtype="int32",
                    name="source_ids",
                ),
                "target_ids": keras.InputSpec(
                    shape=(None, p.target_length), dtype="int32",
                    name="target_ids",
                ),
            }]
        return super().export(
            filepath, format=format, verbose=verbose,
            input_signature=input_signature, **kwargs,
        )

    def export_generator(
        self, path, beam_width=1, max_length=None, length_penalty=0.6, verbose=True
    ):
        """Writes the whole decoding as a TensorFlow SavedModel.

        Its `generate` endpoint maps source ids `(B, S)` (int32, `S` the
        preprocessor's `source_length`) to target ids `(B, L)`, the same
        ids `generate_ids` returns: encoder, cached decoder steps and the
        search loop in one graph, served without Python (TF Serving, or
        `loaded = tf.saved_model.load(path)` then `loaded.generate(ids)`:
        keep the loaded object while calling it, TensorFlow drops its
        variables with it). Tokenisation stays outside
        (`preprocessor.encode_sources`, `preprocessor.decode`).

        Args:
            path: the SavedModel folder to write.
            beam_width, max_length, length_penalty: as for `generate_ids`
                (greedy search for `beam_width=1`).
            verbose: print what was written.

        Raises:
            ValueError: on a backend other than TensorFlow, or a bad
                decoding argument (before anything is written).

        Example:

        ```python
        translator = TransformerTranslator.from_preset("transformer_dates")
        translator.export_generator("dates_generator")
        source_ids = translator.preprocessor.encode_sources(["3 march 1998"])
        loaded = tf.saved_model.load("dates_generator")  # kept: its variables
        ids = loaded.generate(source_ids)  # (1, L), as generate_ids
        ```
        """
        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "export_generator writes a TensorFlow SavedModel and needs "
                "the TensorFlow backend. Received: backend="
                f"{keras.backend.backend()!r}"
            )
        beam_width, max_length = self._check_decoding(
            beam_width, max_length, length_penalty
        )
        search = "greedy" if beam_width == 1 else "beam"
        generate = self._generate_function(
            search, beam_width, max_length, length_penalty, True, False
        )
        archive = keras.export.ExportArchive()
        archive.track(self)
        archive.add_endpoint(
            "generate",
            lambda source_ids: generate(source_ids)[0],
            input_signature=[
                keras.InputSpec(
                    shape=(None, self.preprocessor.source_length), dtype="int32"
                )
            ],
        )
        archive.write_out(path, verbose=verbose)
