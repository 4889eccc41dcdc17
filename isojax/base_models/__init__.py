"""The base models isojax builds and ships for its demos, and how a path names one.

  demo_bases       the shipped bases (package data), their manifests, and the policy
                   path an empty or `demo:` `base_model.path` resolves to
  tiny_base_model  the tiny arithmetic and reasoning bases, pretrained by SFT here
  recall_base      the recall task's base model, constructed rather than trained

`launch.build_base` builds them; runs only load them.
"""
