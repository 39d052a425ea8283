// Ed25519 through OpenSSL 3's EVP interface (src/core/ed25519.hpp), shared by signed
// tickets and execution receipts.
#include "protocol/ed25519.hpp"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "sandbox/signed_ticket.hpp"

namespace sandbox::detail {

namespace fs = std::filesystem;

struct bio_deleter {
  void operator()(BIO* b) const noexcept { BIO_free(b); }
};
using bio_ptr = std::unique_ptr<BIO, bio_deleter>;
struct md_ctx_deleter {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, md_ctx_deleter>;

/// Refuses every passphrase prompt: an encrypted key is an error, never a hang on a terminal.
int no_passphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return -1; }

boost::system::error_code key_file_error(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return make_error_code(errc::not_found);
    case EEXIST:
      return make_error_code(errc::already_exists);
    case EACCES:
    case EPERM:
      return make_error_code(errc::permission_denied);
    case ELOOP:
      return make_error_code(errc::invalid_argument);
    default:
      return make_error_code(errc::io_error);
  }
}

/// Reads a small regular file (key files): at most `max_key_file_bytes`.
result<std::string> read_key_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return key_file_error(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error_code(errc::invalid_argument);
  }
  std::string out;
  std::array<char, 8192> buf{};
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return key_file_error(err);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<std::size_t>(n));
    if (out.size() > max_key_file_bytes) {
      ::close(fd);
      return make_error_code(errc::too_large);
    }
  }
  ::close(fd);
  return out;
}

bool is_ed25519(const EVP_PKEY* k) noexcept {
  return k != nullptr && EVP_PKEY_get_id(k) == EVP_PKEY_ED25519;
}

pkey_ptr read_private_pem(std::string_view pem) {
  if (pem.size() > max_key_file_bytes) return nullptr;
  bio_ptr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return nullptr;
  pkey_ptr k(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!is_ed25519(k.get())) return nullptr;
  return k;
}

pkey_ptr read_public_pem(std::string_view pem) {
  if (pem.size() > max_key_file_bytes) return nullptr;
  bio_ptr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return nullptr;
  pkey_ptr k(PEM_read_bio_PUBKEY(bio.get(), nullptr, no_passphrase, nullptr));
  if (!is_ed25519(k.get())) return nullptr;
  return k;
}

std::optional<std::string> bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n <= 0 || data == nullptr) return std::nullopt;
  return std::string(data, static_cast<std::size_t>(n));
}

std::optional<std::string> public_pem_of(EVP_PKEY* k) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PUBKEY(bio.get(), k) != 1) return std::nullopt;
  return bio_text(bio.get());
}

std::optional<std::string> ed25519_sign(EVP_PKEY* k, std::string_view message) {
  md_ctx_ptr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, k) != 1) {
    return std::nullopt;
  }
  std::string sig(ed25519_signature_bytes, '\0');
  std::size_t len = sig.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      len != ed25519_signature_bytes) {
    return std::nullopt;
  }
  return sig;
}

bool ed25519_verify(EVP_PKEY* k, std::string_view message, std::string_view sig) {
  if (sig.size() != ed25519_signature_bytes) return false;
  md_ctx_ptr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, k) != 1) return false;
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                          reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

/// "k1" from ".../k1.pub.pem" (or ".../k1.pem"; `strip_pub` also strips ".pub").
std::string kid_from_file_name(const fs::path& p, bool strip_pub) {
  std::string name = p.filename().string();
  auto strip = [&](std::string_view suffix) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) {
      name.resize(name.size() - suffix.size());
      return true;
    }
    return false;
  };
  if (strip_pub && strip(".pub.pem")) return name;
  strip(".pem");
  return name;
}

result<ed25519_signing_key> make_signing_key(std::string kid, std::string_view private_pem) {
  if (!is_valid_key_id(kid)) return make_error_code(errc::invalid_argument);
  auto k = read_private_pem(private_pem);
  if (!k) return make_error_code(errc::invalid_argument);
  return ed25519_signing_key{.kid = std::move(kid), .key = std::move(k)};
}

result<ed25519_signing_key> load_signing_key(const fs::path& file, std::string kid) {
  auto text = read_key_file(file);
  if (!text) return text.error();
  if (kid.empty()) kid = kid_from_file_name(file, false);
  return make_signing_key(std::move(kid), *text);
}

std::optional<std::string> private_pem_of(EVP_PKEY* k) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), k, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return std::nullopt;
  }
  return bio_text(bio.get());
}

// --- keyring ----------------------------------------------------------------------------

result<void> ed25519_keyring::add_key(std::string kid, std::string_view public_pem) {
  if (!is_valid_key_id(kid)) return make_error_code(errc::invalid_argument);
  auto k = read_public_pem(public_pem);
  if (!k) return make_error_code(errc::invalid_argument);
  if (keys_.count(kid) != 0) return make_error_code(errc::already_exists);
  keys_.emplace(std::move(kid), std::shared_ptr<EVP_PKEY>(k.release(), pkey_deleter{}));
  return {};
}

result<void> ed25519_keyring::load_key(const fs::path& file, std::string kid) {
  auto text = read_key_file(file);
  if (!text) return text.error();
  if (kid.empty()) kid = kid_from_file_name(file, true);
  return add_key(std::move(kid), *text);
}

result<std::size_t> ed25519_keyring::load_keys(const fs::path& file_or_dir) {
  std::error_code fec;
  const auto st = fs::status(file_or_dir, fec);
  if (fec) return key_file_error(fec.value());
  if (!fs::is_directory(st)) {
    if (auto r = load_key(file_or_dir); !r) return r.error();
    return std::size_t{1};
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(file_or_dir, fec), end; !fec && it != end; it.increment(fec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 8 && name.ends_with(".pub.pem")) files.push_back(it->path());
  }
  if (fec) return key_file_error(fec.value());
  if (files.empty()) return make_error_code(errc::not_found);
  std::sort(files.begin(), files.end());
  ed25519_keyring staged = *this;
  for (const auto& f : files) {
    if (auto r = staged.load_key(f); !r) return r.error();
  }
  *this = std::move(staged);
  return files.size();
}

EVP_PKEY* ed25519_keyring::find(std::string_view kid) const {
  auto it = keys_.find(kid);
  return it == keys_.end() ? nullptr : it->second.get();
}

std::vector<std::string> ed25519_keyring::key_ids() const {
  std::vector<std::string> out;
  for (const auto& [id, key] : keys_) out.push_back(id);
  return out;
}

}  // namespace sandbox::detail
