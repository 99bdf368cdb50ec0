"""An example mipruner plug-in package: `mipruner_stride.stride` registers the method "stride"."""
