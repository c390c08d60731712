// Rules file parser and merge tests (format: docs/rules.md).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "mineru_health/classifier.h"

namespace mineru_health {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ParseRules, GoodFile) {
  const std::string text =
      "\xEF\xBB\xBF# operator rules for the PDF fleet\n"
      "\n"
      "   # indented comment\n"
      "site.font_engine task_local bad_input freetype.*unrecoverable\r\n"
      "site.gpu-xid\tfatal\tcuda\tXid (?:79|48)\\b   \n"
      "site.hash fatal engine_dead engine #\\d+ is down\n"
      "doc.corrupt_cn task_local bad_input 文档损坏\n"
      "site.typed heuristic engine_dead target=type origin=engine "
      "^acme\\.EngineGone\\b\n"
      "site.msg ambiguous out_of_memory origin=engine target=message oom\n"
      "site.generic generic timeout target=frame origin=any ^acme\\.Slow\n"
      "cuda.misaligned_address off\n";
  ParseRulesResult result = parse_rules_text(text, "rules.txt");
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.rules.size(), 7u);
  for (const Rule& rule : result.rules) EXPECT_TRUE(rule.from_operator);
  EXPECT_EQ(result.rules[0].target, RuleTarget::kFrame);  // the defaults
  EXPECT_EQ(result.rules[0].scope, RuleScope::kEngine);   // document text: no
  EXPECT_EQ(result.rules[4].kind, RuleKind::kHeuristic);
  EXPECT_EQ(result.rules[4].target, RuleTarget::kType);
  EXPECT_EQ(result.rules[4].scope, RuleScope::kEngine);
  EXPECT_EQ(result.rules[4].pattern, "^acme\\.EngineGone\\b");
  EXPECT_EQ(result.rules[5].kind, RuleKind::kAmbiguous);
  EXPECT_EQ(result.rules[5].target, RuleTarget::kMessage);
  EXPECT_EQ(result.rules[5].pattern, "oom");
  EXPECT_EQ(result.rules[6].kind, RuleKind::kGeneric);
  ASSERT_EQ(result.disabled.size(), 1u);
  EXPECT_EQ(result.disabled[0], "cuda.misaligned_address");
  EXPECT_EQ(result.rules[0].id, "site.font_engine");
  EXPECT_EQ(result.rules[0].kind, RuleKind::kTaskLocal);
  EXPECT_EQ(result.rules[0].category, "bad_input");
  EXPECT_EQ(result.rules[0].pattern, "freetype.*unrecoverable");
  EXPECT_EQ(result.rules[1].id, "site.gpu-xid");
  EXPECT_EQ(result.rules[1].kind, RuleKind::kFatal);
  EXPECT_EQ(result.rules[1].pattern, "Xid (?:79|48)\\b");
  // '#' inside a pattern is part of it, not a comment.
  EXPECT_EQ(result.rules[2].pattern, "engine #\\d+ is down");
  EXPECT_EQ(result.rules[3].pattern, "文档损坏");
}

TEST(ParseRules, PatternKeepsInnerBlanksAndErrorsNameTheLine) {
  ParseRulesResult result = parse_rules_text(
      "# comment\nx.y fatal cat a  b\ncuda.device_assert off\n", "f.rules");
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.disabled, std::vector<std::string>{"cuda.device_assert"});
  ASSERT_EQ(result.rules.size(), 1u);
  EXPECT_EQ(result.rules[0].id, "x.y");
  EXPECT_EQ(result.rules[0].kind, RuleKind::kFatal);
  EXPECT_EQ(result.rules[0].category, "cat");
  EXPECT_EQ(result.rules[0].pattern, "a  b");

  result = parse_rules_text("\n\nz fatal cat (\n", "f.rules");
  EXPECT_TRUE(result.rules.empty());
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].source, "f.rules");
  EXPECT_EQ(result.errors[0].line, 3);
  EXPECT_EQ(result.errors[0].rule_id, "z");
}

TEST(ParseRules, EmptyAndCommentOnly) {
  EXPECT_TRUE(parse_rules_text("", "a").ok());
  ParseRulesResult result = parse_rules_text("# nothing\n\n  \n", "a");
  EXPECT_TRUE(result.ok());
  EXPECT_TRUE(result.rules.empty());
}

struct BadCase {
  const char* name;
  std::string text;
  int line;
  std::string rule_id;
  std::string message_part;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadLines : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadLines, ErrorNamesSourceLineAndRule) {
  const BadCase& c = GetParam();
  const std::string good = "good.rule fatal engine_dead enginedeaderror\n";
  ParseRulesResult result = parse_rules_text(good + c.text, "/etc/r.rules");
  EXPECT_FALSE(result.ok());
  // All-or-nothing: the good line is not returned either.
  EXPECT_TRUE(result.rules.empty());
  ASSERT_EQ(result.errors.size(), 1u);
  const RuleError& error = result.errors[0];
  EXPECT_EQ(error.source, "/etc/r.rules");
  EXPECT_EQ(error.line, c.line + 1);
  EXPECT_EQ(error.rule_id, c.rule_id);
  EXPECT_TRUE(contains(error.message, c.message_part)) << error.message;
  const std::string full = error.to_string();
  EXPECT_TRUE(contains(full, "/etc/r.rules:" + std::to_string(c.line + 1)))
      << full;
  if (!c.rule_id.empty()) {
    EXPECT_TRUE(contains(full, c.rule_id)) << full;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, BadLines,
    ::testing::Values(
        BadCase{"bad_kind", "x.y deadly cuda boom\n", 1, "x.y",
                "unknown kind 'deadly'"},
        BadCase{"bad_id", "bad!id fatal cuda boom\n", 1, "bad!id",
                "invalid rule id"},
        BadCase{"bad_category", "x.y fatal cu/da boom\n", 1, "x.y",
                "invalid category"},
        BadCase{"bad_pattern", "# c\nsite.broken fatal cuda (unclosed\n", 2,
                "site.broken", "missing )"},
        BadCase{"bad_repeat", "site.rep task_local x a{2,1}\n", 1, "site.rep",
                "invalid repetition size"},
        BadCase{"missing_pattern", "x.y fatal cuda\n", 1, "x.y", "expected"},
        BadCase{"missing_kind", "lonely\n", 1, "lonely", "expected"},
        BadCase{"duplicate_id", "good.rule task_local x other\n", 1,
                "good.rule", "duplicate rule id (first defined on line 1)"},
        BadCase{"bad_target", "x.y fatal cuda target=stack boom\n", 1, "x.y",
                "unknown target 'stack'"},
        BadCase{"bad_origin", "x.y fatal cuda origin=user boom\n", 1, "x.y",
                "unknown origin 'user'"},
        BadCase{"options_without_pattern", "x.y fatal cuda target=type\n", 1,
                "x.y", "expected"},
        BadCase{"off_with_pattern", "cuda.device_assert off cuda boom\n", 1,
                "cuda.device_assert", "'off' takes nothing"},
        BadCase{"off_unknown_builtin", "site.nothing off\n", 1, "site.nothing",
                "names no built-in rule"},
        // Issue 10: 40 of these made one classification take minutes.
        BadCase{"costly_counted_repetition", "evil.1 fatal x a[ab]{14,19}c1q\n",
                1, "evil.1", "too costly: a bounded run of 19"},
        BadCase{"costly_dot_window", "evil.2 fatal x engine.{0,200}dead\n", 1,
                "evil.2", "too costly"},
        BadCase{"pattern_too_long",
                "evil.3 fatal x " + std::string(3000, 'a') + "\n", 1, "evil.3",
                "longer than the limit"}),
    [](const ::testing::TestParamInfo<BadCase>& p) {
      return std::string(p.param.name);
    });

TEST(ParseRules, ReportsEveryBadLine) {
  ParseRulesResult result = parse_rules_text(
      "a fatal x (\nb fatal x ok\nc nope x y\nb fatal x again\n", "f");
  ASSERT_EQ(result.errors.size(), 3u);
  EXPECT_EQ(result.errors[0].line, 1);
  EXPECT_EQ(result.errors[1].line, 3);
  EXPECT_EQ(result.errors[2].line, 4);
  EXPECT_TRUE(result.rules.empty());
}

TEST(ParseRules, RuleCountLimit) {
  std::string text;
  for (std::size_t i = 0; i <= kMaxRulesFileRules; ++i) {
    text += "site.r" + std::to_string(i) + " fatal x literal" +
            std::to_string(i) + "\n";
  }
  ParseRulesResult result = parse_rules_text(text, "many");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].line, static_cast<int>(kMaxRulesFileRules) + 1);
  EXPECT_TRUE(contains(result.errors[0].message, "more than 2000 rules"));
  EXPECT_TRUE(result.rules.empty());
}

TEST(ParseRules, TheLargestAcceptedFileCompilesOverTheBuiltins) {
  std::string text;
  for (std::size_t i = 0; i < kMaxRulesFileRules; ++i) {
    text += "site.r" + std::to_string(i) + " fatal x a[ab]{1,8}c" +
            std::to_string(i) + "q\n";
  }
  ParseRulesResult parsed = parse_rules_text(text, "largest");
  ASSERT_TRUE(parsed.ok());
  CompileResult compiled =
      RuleSet::compile(merge_rules(builtin_rules(), parsed.rules), "largest");
  EXPECT_TRUE(compiled.ok());
  for (const RuleError& error : compiled.errors) {
    ADD_FAILURE() << error.to_string();
  }
}

TEST(ParseRules, RuleErrorToStringWithoutLine) {
  RuleError error{"<builtin>", 0, "x.y", "bad pattern: missing )"};
  EXPECT_EQ(error.to_string(), "<builtin>: rule 'x.y': bad pattern: missing )");
}

TEST(MergeRules, SameIdReplacesInPlaceNewIdsAppend) {
  std::vector<Rule> base = {{"a", RuleKind::kFatal, "x", "one"},
                            {"b", RuleKind::kFatal, "x", "two"}};
  std::vector<Rule> merged =
      merge_rules(base, {{"c", RuleKind::kTaskLocal, "y", "three"},
                         {"a", RuleKind::kTaskLocal, "y", "uno"},
                         {"c", RuleKind::kFatal, "z", "tres"}});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].id, "a");
  EXPECT_EQ(merged[0].pattern, "uno");
  EXPECT_EQ(merged[0].kind, RuleKind::kTaskLocal);
  EXPECT_EQ(merged[1].id, "b");
  EXPECT_EQ(merged[2].id, "c");
  EXPECT_EQ(merged[2].pattern, "tres");
}

TEST(MergeRules, DisabledIdsAreRemoved) {
  std::vector<Rule> base = {{"a", RuleKind::kFatal, "x", "one"},
                            {"b", RuleKind::kFatal, "x", "two"}};
  std::vector<Rule> merged =
      merge_rules(base, {{"c", RuleKind::kTaskLocal, "y", "three"}}, {"a"});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].id, "b");
  EXPECT_EQ(merged[1].id, "c");
}

TEST(MergeRules, OverrideOfABuiltin) {
  // An operator decides EngineDeadError should not restart their worker.
  ParseRulesResult parsed = parse_rules_text(
      "vllm.engine_dead task_local engine_dead target=type "
      "enginedeaderror\n",
      "ops");
  ASSERT_TRUE(parsed.ok());
  const std::vector<Rule> builtins = builtin_rules();
  std::vector<Rule> merged = merge_rules(builtins, parsed.rules);
  ASSERT_EQ(merged.size(), builtins.size());
  CompileResult compiled = RuleSet::compile(merged, "ops");
  ASSERT_TRUE(compiled.ok());
  Classification verdict =
      Classifier(compiled.rule_set)
          .classify({{"vllm.v1.engine.exceptions",
                      "EngineDeadError",
                      {"Exception"},
                      "EngineCore encountered an issue."}});
  EXPECT_TRUE(verdict.matched);
  EXPECT_FALSE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "vllm.engine_dead");
}

TEST(MergeRules, DuplicateWithoutMergeFailsToCompile) {
  std::vector<Rule> rules = builtin_rules();
  rules.push_back({"vllm.engine_dead", RuleKind::kTaskLocal, "x", "y"});
  CompileResult compiled = RuleSet::compile(rules);
  EXPECT_FALSE(compiled.ok());
  ASSERT_EQ(compiled.errors.size(), 1u);
  EXPECT_EQ(compiled.errors[0].rule_id, "vllm.engine_dead");
}

TEST(RulesFileEndToEnd, TaskLocalCarveOutForARuntimeMessage) {
  // An image processor (a runtime module) words one bad image's failure in
  // a way the broad built-in engine.unrecoverable rule meets; docs/rules.md
  // shows this carve-out.
  const std::vector<std::string> bases = {"Exception"};
  Frame frame{"builtins", "ValueError", bases,
              "unrecoverable error in the glyph engine for font 'SimSun'"};
  frame.raised_in = "transformers.image_processing_utils";
  CompileResult builtins_only = RuleSet::compile(builtin_rules());
  ASSERT_TRUE(builtins_only.ok());
  Classification before = Classifier(builtins_only.rule_set).classify({frame});
  EXPECT_TRUE(before.fatal);
  EXPECT_EQ(before.rule, "engine.unrecoverable");

  ParseRulesResult parsed = parse_rules_text(
      "# one font in some scanned PDFs, not the engine\n"
      "site.glyph task_local bad_input target=message glyph engine for font\n"
      "site.doc_cn task_local bad_input 文档损坏\n",
      "/etc/mineru-health.rules");
  ASSERT_TRUE(parsed.ok());
  CompileResult compiled =
      RuleSet::compile(merge_rules(builtin_rules(), parsed.rules));
  ASSERT_TRUE(compiled.ok());
  Classifier classifier(compiled.rule_set);
  Classification after = classifier.classify({frame});
  EXPECT_FALSE(after.fatal);
  EXPECT_EQ(after.rule, "site.glyph");
  EXPECT_EQ(after.category, "bad_input");

  // The Chinese pattern meets both forms: plain, and split by punctuation
  // (compact form).
  Frame plain{"builtins", "ValueError", {}, "文档损坏，无法解析"};
  Frame split{"builtins", "ValueError", {}, "文档-损坏 (page 3)"};
  EXPECT_EQ(classifier.classify({plain}).rule, "site.doc_cn");
  EXPECT_EQ(classifier.classify({split}).rule, "site.doc_cn");
  // The engine still dies for real.
  EXPECT_TRUE(classifier
                  .classify({{"vllm.v1.engine.exceptions",
                              "EngineDeadError",
                              {"Exception"},
                              "EngineCore encountered an issue."}})
                  .fatal);
}

// ---- read_rules_file: bounded, non-blocking
// -----------------------------------

class RulesFileOnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/mineru-health-rules-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const std::string& path : created_) ::unlink(path.c_str());
    ::rmdir((dir_ + "/subdir").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    created_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> created_;
};

TEST_F(RulesFileOnDisk, RegularFileIsParsed) {
  ParseRulesResult result =
      read_rules_file(write("ok.rules", "site.a fatal x boom\n"));
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.rules.size(), 1u);
  EXPECT_EQ(result.rules[0].id, "site.a");
}

TEST_F(RulesFileOnDisk, ErrorsNameTheFile) {
  const std::string path = write("bad.rules", "site.a fatal x (\n");
  ParseRulesResult result = read_rules_file(path);
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].source, path);
  EXPECT_EQ(result.errors[0].line, 1);
}

struct NotAFile {
  const char* name;
  std::string path;  // "" for a FIFO made by the test
  std::string message_part;
};

TEST_F(RulesFileOnDisk, RefusesWhatIsNotASmallRegularFile) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  created_.push_back(fifo);
  ASSERT_EQ(::mkdir((dir_ + "/subdir").c_str(), 0700), 0);
  const std::string big =
      write("big.rules", std::string(kMaxRulesFileBytes + 1, '#'));
  const NotAFile cases[] = {
      {"fifo", fifo, "a FIFO"},  // must not block waiting for a writer
      {"dev_zero", "/dev/zero", "a character device"},
      {"directory", dir_ + "/subdir", "a directory"},
      {"too_big", big, "larger than the limit of 1048576 bytes"},
      {"missing", dir_ + "/absent", "cannot open"},
  };
  for (const NotAFile& c : cases) {
    ParseRulesResult result = read_rules_file(c.path);
    ASSERT_EQ(result.errors.size(), 1u) << c.name;
    EXPECT_EQ(result.errors[0].source, c.path) << c.name;
    EXPECT_TRUE(contains(result.errors[0].message, c.message_part))
        << c.name << ": " << result.errors[0].message;
    EXPECT_TRUE(result.rules.empty());
  }
}

}  // namespace
}  // namespace mineru_health
