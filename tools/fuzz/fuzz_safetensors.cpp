// libFuzzer target: bytes as a safetensors file, through the same checks as a checkpoint on disk.
// A qk::Error is the accepted refusal; any other exception, crash, sanitizer report, leak or
// timeout is a finding (./qk fuzz).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    try {
        const qk::SafetensorsFile file = qk::parse_safetensors(bytes, "fuzz.safetensors");
        // What was accepted must hold the bytes its shape promises: ASan checks every read.
        unsigned checksum = 0;
        for (const auto& [name, tensor] : file.tensors) {
            const auto* p = static_cast<const unsigned char*>(tensor.raw_data());
            for (size_t i = 0; i < size_t(tensor.numel()) * qk::dtype_size(tensor.dtype()); ++i)
                checksum += p[i];
        }
        (void)checksum;
    } catch (const qk::Error&) {
    }
    return 0;
}
