// Classifier::classify: matches every frame of a failure chain against the
// rule set and combines the matches by the precedence of docs/rules.md
// ("Deciding"): operator rules first, then strength, then the frame's place
// in the chain (__cause__, __context__, exception-group member).
#include "mineru_health/classifier.h"

#include <re2/re2.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "rule_set_internal.h"
#include "text_forms.h"

namespace mineru_health {

namespace {

// Identifier-like fields (module, type name, base names, raise site) are
// short in any real exception; a hostile object could make them huge, so
// they are capped independently of the message limits.
constexpr std::size_t kMaxNameBytes = 1024;
constexpr std::size_t kMaxBases = 64;

// ---- origins ----------------------------------------------------------------

struct ModulePrefix {
  const char* prefix;
  Origin origin;
};

// Module prefixes (whole dotted components) and the origin they stand for;
// the longest matching prefix wins, so MinerU's model-inference packages are
// a runtime while the rest of MinerU is not. docs/rules.md lists them.
constexpr ModulePrefix kModulePrefixes[] = {
    // Engines and their IPC.
    {"vllm", Origin::kRuntime},
    {"vllm_ascend", Origin::kRuntime},
    {"vllm_metal", Origin::kRuntime},
    {"lmdeploy", Origin::kRuntime},
    {"_turbomind", Origin::kRuntime},
    {"dlinfer", Origin::kRuntime},
    {"sglang", Origin::kRuntime},
    {"sgl_kernel", Origin::kRuntime},
    {"mlx", Origin::kRuntime},
    {"mlx_lm", Origin::kRuntime},
    {"mlx_vlm", Origin::kRuntime},
    {"transformers", Origin::kRuntime},
    {"accelerate", Origin::kRuntime},
    {"ray", Origin::kRuntime},
    {"zmq", Origin::kRuntime},
    {"mineru_llama_cpp", Origin::kRuntime},
    // Device runtimes and kernels.
    {"torch", Origin::kRuntime},
    {"torch_npu", Origin::kRuntime},
    {"torchair", Origin::kRuntime},
    {"torch_mlu", Origin::kRuntime},
    {"torch_gcu", Origin::kRuntime},
    {"torch_musa", Origin::kRuntime},
    {"torch_sdaa", Origin::kRuntime},
    {"torch_dipu", Origin::kRuntime},
    {"acl", Origin::kRuntime},
    {"triton", Origin::kRuntime},
    {"flash_attn", Origin::kRuntime},
    {"flashinfer", Origin::kRuntime},
    {"xformers", Origin::kRuntime},
    {"cupy", Origin::kRuntime},
    {"pynvml", Origin::kRuntime},
    {"onnxruntime", Origin::kRuntime},
    {"ultralytics", Origin::kRuntime},
    {"doclayout_yolo", Origin::kRuntime},
    // MinerU's model inference (layout, formula, OCR, table models on the
    // device), as opposed to its document conversion.
    {"mineru.model.layout", Origin::kRuntime},
    {"mineru.model.mfr", Origin::kRuntime},
    {"mineru.model.ocr", Origin::kRuntime},
    {"mineru.model.table", Origin::kRuntime},
    {"mineru.model.utils", Origin::kRuntime},
    {"mineru.model.vlm", Origin::kRuntime},
    // MinerU 1.x (magic_pdf): the same split.
    {"magic_pdf.model", Origin::kRuntime},
    // Text from documents, users or remote servers.
    {"mineru", Origin::kUntrusted},
    {"mineru_vl_utils", Origin::kUntrusted},
    {"magic_pdf", Origin::kUntrusted},
    {"lxml", Origin::kUntrusted},
    {"xml", Origin::kUntrusted},
    {"html", Origin::kUntrusted},
    {"bs4", Origin::kUntrusted},
    {"html5lib", Origin::kUntrusted},
    {"pypdfium2", Origin::kUntrusted},
    {"pdfminer", Origin::kUntrusted},
    {"pdfplumber", Origin::kUntrusted},
    {"pypdf", Origin::kUntrusted},
    {"PyPDF2", Origin::kUntrusted},
    {"fitz", Origin::kUntrusted},
    {"pymupdf", Origin::kUntrusted},
    {"PIL", Origin::kUntrusted},
    {"cv2", Origin::kUntrusted},
    {"zipfile", Origin::kUntrusted},
    {"zlib", Origin::kUntrusted},
    {"gzip", Origin::kUntrusted},
    {"tarfile", Origin::kUntrusted},
    {"docx", Origin::kUntrusted},
    {"openpyxl", Origin::kUntrusted},
    {"pptx", Origin::kUntrusted},
    {"xlrd", Origin::kUntrusted},
    {"olefile", Origin::kUntrusted},
    {"markdown", Origin::kUntrusted},
    {"json", Origin::kUntrusted},
    {"csv", Origin::kUntrusted},
    {"email", Origin::kUntrusted},
    {"base64", Origin::kUntrusted},
    {"binascii", Origin::kUntrusted},
    {"encodings", Origin::kUntrusted},
    {"codecs", Origin::kUntrusted},
    {"httpx", Origin::kUntrusted},
    {"httpcore", Origin::kUntrusted},
    {"httpx_retries", Origin::kUntrusted},
    {"openai", Origin::kUntrusted},
    {"aiohttp", Origin::kUntrusted},
    {"requests", Origin::kUntrusted},
    {"urllib3", Origin::kUntrusted},
    {"urllib", Origin::kUntrusted},
    {"http", Origin::kUntrusted},
    {"fastapi", Origin::kUntrusted},
    {"starlette", Origin::kUntrusted},
    {"pydantic", Origin::kUntrusted},
};

// kUnknown for no module or builtins (which says nothing about the raiser).
Origin module_origin(const std::string& module) {
  if (module.empty() || module == "builtins") return Origin::kUnknown;
  std::size_t best_length = 0;
  Origin best = Origin::kOther;
  for (const ModulePrefix& entry : kModulePrefixes) {
    const std::string prefix = entry.prefix;
    if (prefix.size() <= best_length) continue;
    if (module.compare(0, prefix.size(), prefix) != 0) continue;
    if (module.size() != prefix.size() && module[prefix.size()] != '.') {
      continue;
    }
    best_length = prefix.size();
    best = entry.origin;
  }
  return best;
}

// ---- frame texts ------------------------------------------------------------

// "module.Type (Base1 Base2)", the class part of the type and frame texts.
std::string class_text(const Frame& frame) {
  std::string text = text::truncated_copy(frame.module, kMaxNameBytes);
  if (!text.empty()) text.push_back('.');
  text += text::truncated_copy(frame.type_name, kMaxNameBytes);
  if (!frame.bases.empty()) {
    text += " (";
    const std::size_t count = std::min(frame.bases.size(), kMaxBases);
    for (std::size_t i = 0; i < count; ++i) {
      if (i > 0) text.push_back(' ');
      text += text::truncated_copy(frame.bases[i], kMaxNameBytes);
    }
    text.push_back(')');
  }
  return text;
}

std::string type_text(const Frame& frame) {
  std::string text = class_text(frame);
  if (!frame.raised_in.empty()) {
    if (!text.empty()) text.push_back(' ');
    text += "@" + text::truncated_copy(frame.raised_in, kMaxNameBytes);
  }
  return text;
}

// "module.Type (Base1 Base2): message"; a frame parsed from bare text has no
// name, so its text is the message.
std::string frame_text(const Frame& frame, const std::string& message) {
  std::string text = class_text(frame);
  if (!text.empty()) text += ": ";
  text += message;
  return text;
}

// ---- precedence -------------------------------------------------------------

constexpr int kNoMatch = INT_MAX;

// One candidate for the verdict: the rule's kind as a rank (RuleKind's order
// is the ladder, strongest first), the frame it matched and the rule.
struct Hit {
  int rank = kNoMatch;
  int frame = -1;
  std::size_t rule = 0;

  bool found() const { return rank != kNoMatch; }
  bool fatal() const {
    return found() && is_fatal(static_cast<RuleKind>(rank));
  }
};

// Stronger first; at equal strength the outer frame (earlier in pre-order)
// decides, then the rule listed first.
bool better(const Hit& a, const Hit& b) {
  if (a.rank != b.rank) return a.rank < b.rank;
  if (a.frame != b.frame) return a.frame < b.frame;
  return a.rule < b.rule;
}

const Hit& best(const Hit& a, const Hit& b) { return better(b, a) ? b : a; }

// What a frame's subtree has gathered from its children so far.
struct Pending {
  Hit cause;
  Hit context;
  Hit group_fatal;
  Hit group_other;
};

// Combines one frame's own match with its children's results (docs/rules.md,
// "Deciding").
Hit decide(const Hit& own, const Pending& children) {
  Hit main = best(own, children.cause);
  // A group is fatal when any member is, whatever the others say.
  const Hit& group = children.group_fatal.found() ? children.group_fatal
                                                  : children.group_other;
  main = best(main, group);
  // An exception raised while handling another never turns a fatal verdict
  // into a milder one; it may still make it stronger.
  const Hit& context = children.context;
  if (main.fatal()) {
    if (context.fatal() && context.rank < main.rank) main = context;
  } else {
    main = best(main, context);
  }
  return main;
}

}  // namespace

const char* to_string(Origin origin) {
  switch (origin) {
    case Origin::kUnknown:
      return "unknown";
    case Origin::kRuntime:
      return "runtime";
    case Origin::kUntrusted:
      return "untrusted";
    case Origin::kOther:
      return "other";
  }
  return "unknown";
}

Origin frame_origin(const Frame& frame) {
  const Origin of_class =
      module_origin(text::truncated_copy(frame.module, kMaxNameBytes));
  const Origin of_site =
      module_origin(text::truncated_copy(frame.raised_in, kMaxNameBytes));
  // Untrusted text wins: a document library's exception, or anything MinerU's
  // conversion code raised, never counts as the engine's, whatever it says.
  if (of_class == Origin::kUntrusted || of_site == Origin::kUntrusted) {
    return Origin::kUntrusted;
  }
  if (of_class == Origin::kRuntime || of_site == Origin::kRuntime) {
    return Origin::kRuntime;
  }
  if (of_class == Origin::kUnknown && of_site == Origin::kUnknown &&
      frame.raised_in.empty()) {
    return Origin::kUnknown;
  }
  return Origin::kOther;
}

const char* Classification::kind() const {
  if (fatal) return "fatal";
  return ambiguous ? "ambiguous" : "task_local";
}

const char* Classification::strength() const {
  return matched ? strength_name(rule_kind) : "";
}

Classifier::Classifier(std::shared_ptr<const RuleSet> rule_set,
                       ClassifierLimits limits)
    : rule_set_(std::move(rule_set)), limits_(limits) {
  if (rule_set_ == nullptr) {
    // An empty set classifies everything as unmatched (task-local) rather
    // than crashing on a caller's mistake.
    rule_set_ = RuleSet::compile({}).rule_set;
  }
}

Classification Classifier::classify(const std::vector<Frame>& frames,
                                    const ClassifyOptions& options) const {
  const std::vector<Rule>& rules = rule_set_->rules();
  const std::size_t count =
      std::min({frames.size(), limits_.max_frames,
                static_cast<std::size_t>(std::numeric_limits<int>::max())});
  if (count == 0) return Classification{};

  // ---- 1. the tree: every frame's parent and how it was reached ----------
  std::vector<int> depth(count, 0);
  std::vector<Via> via(count, Via::kRoot);
  std::vector<int> parent(count, -1);
  {
    std::vector<int> ancestors;  // the path from the root to frame i - 1
    for (std::size_t i = 0; i < count; ++i) {
      const Frame& frame = frames[i];
      if (i > 0) {
        const int previous = depth[i - 1];
        int d = frame.depth;
        if (d < 1 || d > previous + 1) d = previous + 1;
        depth[i] = d;
        via[i] = frame.via == Via::kRoot ? Via::kCause : frame.via;
      }
      while (!ancestors.empty() &&
             depth[static_cast<std::size_t>(ancestors.back())] >= depth[i]) {
        ancestors.pop_back();
      }
      parent[i] = ancestors.empty() ? -1 : ancestors.back();
      ancestors.push_back(static_cast<int>(i));
    }
  }

  // ---- 2. every frame's matching rules, scopes applied --------------------
  std::vector<std::vector<std::size_t>> matches(count);
  std::vector<Origin> origins(count);
  std::vector<std::string> bounded_messages(count);
  std::size_t message_budget = limits_.max_total_message_bytes;
  for (std::size_t i = 0; i < count; ++i) {
    const Frame& frame = frames[i];
    origins[i] = frame_origin(frame);
    const std::size_t allowance =
        std::min(limits_.max_message_bytes, message_budget);
    bounded_messages[i] =
        sanitize_utf8(text::head_and_tail(frame.message, allowance));
    message_budget -= std::min(frame.message.size(), allowance);

    std::vector<std::size_t> found;
    auto scan = [&found](const RuleSet::TargetSet& set,
                         const std::string& sanitized) {
      if (set.empty() || sanitized.empty()) return;
      set.match(sanitized, &found);
      set.match(compact_form(sanitized), &found);
    };
    scan(*rule_set_->type_, sanitize_utf8(type_text(frame)));
    scan(*rule_set_->message_, bounded_messages[i]);
    if (!rule_set_->frame_->empty()) {
      scan(*rule_set_->frame_,
           sanitize_utf8(frame_text(frame, bounded_messages[i])));
    }
    const bool engine_may_judge =
        origins[i] == Origin::kRuntime ||
        (origins[i] == Origin::kUnknown && options.trust_unknown_origin);
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
    for (std::size_t rule_index : found) {
      const Rule& rule = rules[rule_index];
      if (rule.target != RuleTarget::kType &&
          rule.scope == RuleScope::kEngine && !engine_may_judge) {
        continue;
      }
      matches[i].push_back(rule_index);
    }
  }

  // ---- 3. decide, operator rules first ------------------------------------
  auto decide_layer = [&](bool from_operator) {
    std::vector<Pending> pending(count);
    Hit root;
    for (std::size_t k = count; k-- > 0;) {
      Hit own;
      for (std::size_t rule_index : matches[k]) {
        const Rule& rule = rules[rule_index];
        if (rule.from_operator != from_operator) continue;
        own = best(own, Hit{static_cast<int>(rule.kind), static_cast<int>(k),
                            rule_index});
      }
      const Hit result = decide(own, pending[k]);
      if (parent[k] < 0) {
        root = result;
        continue;
      }
      Pending& up = pending[static_cast<std::size_t>(parent[k])];
      switch (via[k]) {
        case Via::kRoot:
        case Via::kCause:
          up.cause = best(up.cause, result);
          break;
        case Via::kContext:
          up.context = best(up.context, result);
          break;
        case Via::kGroupMember:
          if (result.fatal()) {
            up.group_fatal = best(up.group_fatal, result);
          } else {
            up.group_other = best(up.group_other, result);
          }
          break;
      }
    }
    return root;
  };
  Hit hit = decide_layer(true);
  if (!hit.found()) hit = decide_layer(false);

  Classification verdict;
  if (!hit.found()) return verdict;
  const Rule& rule = rules[hit.rule];
  const std::size_t frame_index = static_cast<std::size_t>(hit.frame);
  verdict.matched = true;
  verdict.rule_kind = rule.kind;
  verdict.fatal = is_fatal(rule.kind);
  verdict.ambiguous = rule.kind == RuleKind::kAmbiguous;
  verdict.rule = rule.id;
  verdict.category = rule.category;
  verdict.frame_index = hit.frame;
  if (options.remote_engine) {
    // With a remote engine only this process's own engine or device
    // exceptions can mean this worker is broken; the rest came from (or
    // about) the remote server. Operator rules keep their word.
    if (verdict.fatal && !rule.from_operator &&
        origins[frame_index] != Origin::kRuntime) {
      verdict.fatal = false;
      verdict.remote_engine = true;
      verdict.category = "remote_engine";
    } else if (verdict.category == "remote_engine") {
      verdict.remote_engine = true;
    }
  }

  // ---- 4. an excerpt of the deciding frame around the match ---------------
  const Frame& frame = frames[frame_index];
  const std::string text =
      rule.target == RuleTarget::kType ? sanitize_utf8(type_text(frame))
      : rule.target == RuleTarget::kMessage
          ? bounded_messages[frame_index]
          : sanitize_utf8(frame_text(frame, bounded_messages[frame_index]));
  const RuleSet::TargetSet& set =
      rule.target == RuleTarget::kType      ? *rule_set_->type_
      : rule.target == RuleTarget::kMessage ? *rule_set_->message_
                                            : *rule_set_->frame_;
  const RE2* regexp = nullptr;
  for (std::size_t s = 0; s < set.rule_index.size(); ++s) {
    if (set.rule_index[s] == hit.rule) regexp = set.regexps[s].get();
  }
  re2::StringPiece found;
  if (regexp != nullptr &&
      regexp->Match(text, 0, text.size(), RE2::UNANCHORED, &found, 1)) {
    const auto begin = static_cast<std::size_t>(found.data() - text.data());
    verdict.excerpt = text::window_excerpt(text, begin, begin + found.size(),
                                           limits_.excerpt_bytes);
  } else {
    // Matched in the compact form only: the message's head says the most.
    verdict.excerpt =
        text::head_excerpt(sanitize_utf8(text::truncated_copy(
                               frame.message, limits_.excerpt_bytes + 4)),
                           limits_.excerpt_bytes);
  }
  return verdict;
}

}  // namespace mineru_health
