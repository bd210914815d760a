"""Arrow and numpy kernels of the feature job, with no Beam: the Beam stages, the
streaming job and the single-process reference all stand on them.
"""
