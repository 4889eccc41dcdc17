"""The configuration layer: ConfigDict files resolved once into typed settings.

  config_lib        ConfigDicts: the base config, recipes, presets, and their resolution
                    into RunSettings (the only place a ConfigDict becomes settings)
  run_settings      RunSettings: every subsystem's settings section and the rules that
                    span them
  config_reference  docs/configs.md's field tables, generated from the settings classes

Below `isojax.main` and the binaries, every layer reads RunSettings, never a ConfigDict.
"""
