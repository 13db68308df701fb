# Sourced by the device scripts that use Vulkan: unpacks the loader carried in .gl/ (the image has
# the NVIDIA driver's manifest but no libvulkan) into / as the device notes say, and points the
# loader at the NVIDIA manifests where its own search finds none.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[[ -f $nv ]] && export VK_DRIVER_FILES=$nv
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[[ -f $egl ]] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
export XDG_RUNTIME_DIR=/tmp
