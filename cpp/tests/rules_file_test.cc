// Rules file parser and merge tests (format: docs/rules.md).
#include <gtest/gtest.h>

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
      "doc.corrupt_cn task_local bad_input 文档损坏\n";
  ParseRulesResult result = parse_rules_text(text, "rules.txt");
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.rules.size(), 4u);
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
                "good.rule", "duplicate rule id (first defined on line 1)"}),
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

TEST(MergeRules, OverrideOfABuiltin) {
  // An operator decides EngineDeadError should not restart their worker.
  ParseRulesResult parsed = parse_rules_text(
      "vllm.engine_dead task_local engine_dead enginedeaderror\n", "ops");
  ASSERT_TRUE(parsed.ok());
  const std::vector<Rule> builtins = builtin_rules();
  std::vector<Rule> merged = merge_rules(builtins, parsed.rules);
  ASSERT_EQ(merged.size(), builtins.size());
  CompileResult compiled = RuleSet::compile(merged, "ops");
  ASSERT_TRUE(compiled.ok());
  Verdict verdict = Classifier(compiled.rule_set)
                        .classify({{"vllm.v1.engine.exceptions",
                                    "EngineDeadError",
                                    {"Exception"},
                                    "EngineCore encountered an issue."}});
  EXPECT_TRUE(verdict.matched);
  EXPECT_FALSE(verdict.fatal);
  EXPECT_EQ(verdict.rule_id, "vllm.engine_dead");
}

TEST(MergeRules, DuplicateWithoutMergeFailsToCompile) {
  std::vector<Rule> rules = builtin_rules();
  rules.push_back({"vllm.engine_dead", RuleKind::kTaskLocal, "x", "y"});
  CompileResult compiled = RuleSet::compile(rules);
  EXPECT_FALSE(compiled.ok());
  ASSERT_EQ(compiled.errors.size(), 1u);
  EXPECT_EQ(compiled.errors[0].rule_id, "vllm.engine_dead");
}

TEST(RulesFileEndToEnd, TaskLocalCarveOutForADocumentError) {
  // A font library's message about its "engine" trips the broad builtin
  // engine.unrecoverable rule; docs/rules.md shows this carve-out.
  const std::vector<std::string> bases = {"RuntimeError", "Exception"};
  const Frame frame{"fontlib", "FontError", bases,
                    "FreeType: unrecoverable error in the glyph engine for "
                    "font 'SimSun'"};
  CompileResult builtins_only = RuleSet::compile(builtin_rules());
  ASSERT_TRUE(builtins_only.ok());
  Verdict before = Classifier(builtins_only.rule_set).classify({frame});
  EXPECT_TRUE(before.fatal);
  EXPECT_EQ(before.rule_id, "engine.unrecoverable");

  ParseRulesResult parsed = parse_rules_text(
      "# fonts in some scanned PDFs break FreeType, not the engine\n"
      "site.freetype task_local bad_input ^fontlib\\.FontError\\b.*freetype\n"
      "site.doc_cn task_local bad_input 文档损坏\n",
      "/etc/mineru-health.rules");
  ASSERT_TRUE(parsed.ok());
  CompileResult compiled =
      RuleSet::compile(merge_rules(builtin_rules(), parsed.rules));
  ASSERT_TRUE(compiled.ok());
  Classifier classifier(compiled.rule_set);
  Verdict after = classifier.classify({frame});
  EXPECT_FALSE(after.fatal);
  EXPECT_EQ(after.rule_id, "site.freetype");
  EXPECT_EQ(after.category, "bad_input");

  // The Chinese pattern meets both forms: plain, and split by punctuation
  // (compact form).
  Frame plain{"builtins", "ValueError", {}, "文档损坏，无法解析"};
  Frame split{"builtins", "ValueError", {}, "文档-损坏 (page 3)"};
  EXPECT_EQ(classifier.classify({plain}).rule_id, "site.doc_cn");
  EXPECT_EQ(classifier.classify({split}).rule_id, "site.doc_cn");
  // The engine still dies for real.
  EXPECT_TRUE(classifier
                  .classify({{"vllm.v1.engine.exceptions",
                              "EngineDeadError",
                              {"Exception"},
                              "EngineCore encountered an issue."}})
                  .fatal);
}

}  // namespace
}  // namespace mineru_health
