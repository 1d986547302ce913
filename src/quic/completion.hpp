// What a queued chunk of stream data calls back when it is done with: a move-only callable
// run exactly once, with Errc::ok once the peer acknowledged every byte of the chunk, or
// with the error that made the connection drop it. It also owns whatever keeps the chunk's
// bytes alive (a pooled buffer, a pending operation), so the QUIC layer neither knows the
// transport's buffers nor completes its operations. Small callables are stored inline: one
// is made per message, and an allocation each would show on the small-message path.
#pragma once

#include <nexar/error.hpp>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

namespace nexar::quic {

class Completion {
 public:
  Completion() noexcept = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, Completion> &&
             std::is_invocable_v<F&, Errc, const std::string&>)
  Completion(F f) {  // NOLINT(google-explicit-constructor): callables convert, like std::function
    using Box = Boxed<F>;
    if constexpr (sizeof(Box) <= kInline && alignof(Box) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<F>) {
      fn_ = ::new (static_cast<void*>(buf_)) Box(std::move(f));
    } else {
      fn_ = new Heap<F>(std::make_unique<F>(std::move(f)));
    }
  }
  Completion(Completion&& o) noexcept { take(o); }
  Completion& operator=(Completion&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion() { reset(); }

  explicit operator bool() const noexcept { return fn_ != nullptr; }

  /// Runs the callable (at most once: it is released right after).
  void operator()(Errc code, const std::string& why = {}) {
    if (!fn_) return;
    fn_->call(code, why);
    reset();
  }

 private:
  static constexpr std::size_t kInline = 64;
  struct Base {
    virtual ~Base() = default;
    virtual void call(Errc code, const std::string& why) = 0;
    /// Moves itself into `dst` (inline storage) and returns it; heap ones return nullptr.
    virtual Base* move_to(void* dst) noexcept = 0;
    virtual bool inline_stored() const noexcept = 0;
  };
  template <class F>
  struct Boxed final : Base {
    explicit Boxed(F f) : fn(std::move(f)) {}
    void call(Errc code, const std::string& why) override { fn(code, why); }
    Base* move_to(void* dst) noexcept override { return ::new (dst) Boxed(std::move(fn)); }
    bool inline_stored() const noexcept override { return true; }
    F fn;
  };
  template <class F>
  struct Heap final : Base {
    explicit Heap(std::unique_ptr<F> f) : fn(std::move(f)) {}
    void call(Errc code, const std::string& why) override { (*fn)(code, why); }
    Base* move_to(void*) noexcept override { return nullptr; }
    bool inline_stored() const noexcept override { return false; }
    std::unique_ptr<F> fn;
  };

  void take(Completion& o) noexcept {
    if (!o.fn_) return;
    if (o.fn_->inline_stored()) {
      fn_ = o.fn_->move_to(buf_);
      o.reset();
    } else {
      fn_ = o.fn_;  // the heap box changes hands
      o.fn_ = nullptr;
    }
  }
  void reset() noexcept {
    if (!fn_) return;
    if (fn_->inline_stored()) {
      fn_->~Base();
    } else {
      delete fn_;
    }
    fn_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buf_[kInline];
  Base* fn_ = nullptr;
};

}  // namespace nexar::quic
