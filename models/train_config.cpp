// models/train_config.cpp: TOML -> TrainConfig, through one table of keys (train_config.h).
#include "models/train_config.h"

#include <toml++/toml.h>

#include <functional>
#include <map>
#include <sstream>
#include <variant>

#include "data/files.h"
#include "strata/error.h"

namespace strata::models {
namespace {

using FieldPtr = std::variant<int64_t*, double*, bool*, std::string*>;

struct Field {
  std::string key;  // "train.steps"
  FieldPtr ptr;
  std::function<std::string(const TrainConfig&)> check;  // "" when valid, else "expected ..."
};

std::string at_least(int64_t v, int64_t lo) {
  return v >= lo ? "" : "an integer >= " + std::to_string(lo);
}

std::string one_of(const std::string& v, std::initializer_list<const char*> options) {
  std::string all;
  for (const char* o : options) {
    if (v == o) return "";
    all += all.empty() ? "" : " | ";
    all += std::string("\"") + o + "\"";
  }
  return "one of " + all;
}

// "" when `v` is "cpu", "cuda" or "cuda:N" (N a decimal index); whether the machine has that
// device is checked where the run starts (trainer.h training_device), not when a config is read.
std::string device_syntax(const std::string& v) {
  if (v == "cpu" || v == "cuda") return "";
  const std::string p = "cuda:";
  if (v.size() > p.size() && v.compare(0, p.size(), p) == 0 &&
      v.find_first_not_of("0123456789", p.size()) == std::string::npos && v.size() - p.size() <= 3)
    return "";
  return "\"cpu\" | \"cuda\" | \"cuda:N\"";
}

// The one list of keys: name, where it lives, its check (`c` is the whole config, for cross-key checks).
std::vector<Field> fields(TrainConfig& c) {
  auto& m = c.model;
  auto& d = c.data;
  auto& t = c.train;
  return {
      {"name", &c.name, [](const TrainConfig& x) { return x.name.empty() ? "a non-empty string" : ""; }},
      {"task", &c.task, [](const TrainConfig& x) { return one_of(x.task, {"charlm", "icr", "ett"}); }},
      {"seed", &c.seed, [](const TrainConfig& x) { return at_least(x.seed, 0); }},
      {"model.width", &m.width, [](const TrainConfig& x) { return at_least(x.model.width, 1); }},
      {"model.layers", &m.layers, [](const TrainConfig& x) { return at_least(x.model.layers, 1); }},
      {"model.heads", &m.heads,
       [](const TrainConfig& x) {
         if (x.model.heads < 1) return std::string("an integer >= 1");
         return x.model.width % x.model.heads == 0
                    ? std::string()
                    : "a divisor of model.width = " + std::to_string(x.model.width);
       }},
      {"model.attention", &m.attention, [](const TrainConfig& x) { return x.model.attention.empty() ? "a non-empty attention pattern" : ""; }},
      {"model.bias", &m.bias, nullptr},
      {"model.qk_layernorm", &m.qk_layernorm, nullptr},
      {"model.fused", &m.fused, nullptr},
      {"model.dropout", &m.dropout,
       [](const TrainConfig& x) { return x.model.dropout >= 0 && x.model.dropout < 1 ? "" : "a number in [0, 1)"; }},
      {"model.kind", &m.kind, [](const TrainConfig& x) { return one_of(x.model.kind, {"patch", "point"}); }},
      {"model.ffn", &m.ffn, [](const TrainConfig& x) { return at_least(x.model.ffn, 0); }},
      {"model.patch_len", &m.patch_len, [](const TrainConfig& x) { return at_least(x.model.patch_len, 1); }},
      {"model.stride", &m.stride, [](const TrainConfig& x) { return at_least(x.model.stride, 1); }},
      {"model.revin", &m.revin, nullptr},
      {"data.corpus", &d.corpus, [](const TrainConfig& x) { return x.data.corpus.empty() ? "a corpus name or path" : ""; }},
      {"data.context", &d.context, [](const TrainConfig& x) { return at_least(x.data.context, 1); }},
      {"data.val_fraction", &d.val_fraction,
       [](const TrainConfig& x) { return x.data.val_fraction > 0 && x.data.val_fraction < 1 ? "" : "a number in (0, 1)"; }},
      {"data.dim", &d.dim, [](const TrainConfig& x) { return at_least(x.data.dim, 1); }},
      {"data.start_dims", &d.start_dims,
       [](const TrainConfig& x) {
         return x.data.start_dims >= 1 && x.data.start_dims <= x.data.dim
                    ? ""
                    : "an integer in [1, data.dim = " + std::to_string(x.data.dim) + "]";
       }},
      {"data.start_points", &d.start_points, [](const TrainConfig& x) { return at_least(x.data.start_points, 1); }},
      {"data.interval", &d.interval, [](const TrainConfig& x) { return at_least(x.data.interval, 1); }},
      {"data.updates", &d.updates, [](const TrainConfig& x) { return at_least(x.data.updates, 1); }},
      {"data.eval_prompts", &d.eval_prompts, [](const TrainConfig& x) { return at_least(x.data.eval_prompts, 1); }},
      {"data.dataset", &d.dataset, [](const TrainConfig& x) { return one_of(x.data.dataset, {"ETTh1"}); }},
      {"data.input_len", &d.input_len, [](const TrainConfig& x) { return at_least(x.data.input_len, 1); }},
      {"data.horizon", &d.horizon, [](const TrainConfig& x) { return at_least(x.data.horizon, 1); }},
      {"train.steps", &t.steps, [](const TrainConfig& x) { return at_least(x.train.steps, 1); }},
      {"train.batch", &t.batch, [](const TrainConfig& x) { return at_least(x.train.batch, 1); }},
      {"train.accum", &t.accum,
       [](const TrainConfig& x) {
         if (x.train.accum < 1) return std::string("an integer >= 1");
         return x.train.batch % x.train.accum == 0
                    ? std::string()
                    : "a divisor of train.batch = " + std::to_string(x.train.batch);
       }},
      {"train.lr", &t.lr, [](const TrainConfig& x) { return x.train.lr > 0 ? "" : "a number > 0"; }},
      {"train.warmup", &t.warmup, [](const TrainConfig& x) { return at_least(x.train.warmup, 0); }},
      {"train.schedule", &t.schedule, [](const TrainConfig& x) { return one_of(x.train.schedule, {"constant", "cosine"}); }},
      {"train.min_lr_ratio", &t.min_lr_ratio,
       [](const TrainConfig& x) { return x.train.min_lr_ratio >= 0 && x.train.min_lr_ratio <= 1 ? "" : "a number in [0, 1]"; }},
      {"train.clip", &t.clip, [](const TrainConfig& x) { return x.train.clip >= 0 ? "" : "a number >= 0 (0 = no clipping)"; }},
      {"train.param", &t.param, [](const TrainConfig& x) { return one_of(x.train.param, {"mup", "sp"}); }},
      {"train.zero_init", &t.zero_init, nullptr},
      {"train.base_width", &t.base_width, [](const TrainConfig& x) { return x.train.base_width > 0 ? "" : "a number > 0"; }},
      {"train.weight_decay", &t.weight_decay, [](const TrainConfig& x) { return x.train.weight_decay >= 0 ? "" : "a number >= 0"; }},
      {"train.beta1", &t.beta1, [](const TrainConfig& x) { return x.train.beta1 >= 0 && x.train.beta1 < 1 ? "" : "a number in [0, 1)"; }},
      {"train.beta2", &t.beta2, [](const TrainConfig& x) { return x.train.beta2 >= 0 && x.train.beta2 < 1 ? "" : "a number in [0, 1)"; }},
      {"train.eps", &t.eps, [](const TrainConfig& x) { return x.train.eps > 0 ? "" : "a number > 0"; }},
      {"train.eval_every", &t.eval_every, [](const TrainConfig& x) { return at_least(x.train.eval_every, 1); }},
      {"train.eval_batches", &t.eval_batches, [](const TrainConfig& x) { return at_least(x.train.eval_batches, 0); }},
      {"train.log_every", &t.log_every, [](const TrainConfig& x) { return at_least(x.train.log_every, 1); }},
      {"train.checkpoint_every", &t.checkpoint_every, [](const TrainConfig& x) { return at_least(x.train.checkpoint_every, 1); }},
      {"train.keep_checkpoints", &t.keep_checkpoints, [](const TrainConfig& x) { return at_least(x.train.keep_checkpoints, 1); }},
      {"train.threads", &t.threads, [](const TrainConfig& x) { return at_least(x.train.threads, 0); }},
      {"train.device", &t.device, [](const TrainConfig& x) { return device_syntax(x.train.device); }},
  };
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "number";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    default: return "date/time";
  }
}

std::string node_text(const toml::node& n) {
  std::ostringstream os;
  if (auto s = n.as_string()) os << '"' << s->get() << '"';
  else if (auto i = n.as_integer()) os << i->get();
  else if (auto f = n.as_floating_point()) os << f->get();
  else if (auto b = n.as_boolean()) os << (b->get() ? "true" : "false");
  else if (n.is_table()) os << "a table";
  else if (n.is_array()) os << "an array";
  else os << "a date/time";
  return os.str();
}

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& what) {
  throw Error("config '" + origin + "': key '" + key + "': " + what);
}

// Sets the field from a TOML value, checking the type (an integer is accepted for a number).
void assign(const Field& f, const toml::node& n, const std::string& origin) {
  const auto expected = [&](const char* what) {
    fail(origin, f.key, std::string("expected ") + what + ", got " + node_text(n) + " (" + type_name(n) + ")");
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!n.is_integer()) expected("an integer");
          *p = n.as_integer()->get();
        } else if constexpr (std::is_same_v<T, double>) {
          if (n.is_integer()) *p = double(n.as_integer()->get());
          else if (n.is_floating_point()) *p = n.as_floating_point()->get();
          else expected("a number");
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) expected("true or false");
          *p = n.as_boolean()->get();
        } else {
          if (!n.is_string()) expected("a string");
          *p = n.as_string()->get();
        }
      },
      f.ptr);
}

// Deep merge: tables merged key by key, anything else replaced.
void merge_into(toml::table& dst, const toml::table& src) {
  for (const auto& [k, v] : src) {
    auto* d = dst.get(k);
    if (d && d->is_table() && v.is_table()) merge_into(*d->as_table(), *v.as_table());
    else dst.insert_or_assign(k, v);
  }
}

// Every leaf of `t` as (dotted key, node), tables recursed.
void leaves(const toml::table& t, const std::string& prefix, std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (v.is_table() && !v.as_table()->empty()) leaves(*v.as_table(), key, out);
    else out.emplace_back(key, &v);
  }
}

std::string known_keys_of(const std::vector<Field>& fs, const std::string& key) {
  const auto dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot + 1);
  std::string all;
  for (const auto& f : fs) {
    if (f.key.compare(0, section.size(), section) != 0) continue;
    if (f.key.find('.', section.size()) != std::string::npos) continue;
    all += all.empty() ? "" : ", ";
    all += f.key.substr(section.size());
  }
  std::string where = "the top level";
  if (!section.empty()) {
    where = "[";
    where.append(section, 0, section.size() - 1);
    where += "]";
  }
  return all.empty() ? "no such section (sections: model, data, train, sizes)" : "keys of " + where + ": " + all;
}

// Applies "a.b=value" to the table (a bare word that is not TOML is a string).
void apply_set(toml::table& root, const std::string& set, const std::string& origin) {
  const auto eq = set.find('=');
  STRATA_CHECK(eq != std::string::npos && eq > 0, "config '", origin, "': --set '", set,
               "': expected key=value (e.g. train.steps=100)");
  const std::string key = set.substr(0, eq), value = set.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);  // a bare word: a string
  }
  toml::table* t = &root;
  size_t begin = 0;
  for (size_t dot; (dot = key.find('.', begin)) != std::string::npos; begin = dot + 1) {
    const std::string part = key.substr(begin, dot - begin);
    auto* n = t->get(part);
    if (!n) {
      t->insert_or_assign(part, toml::table{});
      n = t->get(part);
    }
    if (!n->is_table()) fail(origin, key, "--set: '" + part + "' is not a section");
    t = n->as_table();
  }
  t->insert_or_assign(key.substr(begin), *parsed.get("v"));
}

// Keys of earlier versions, as the current ones (a saved run's config.toml stays readable):
// train.mup = true | false is train.param = "mup" | "sp".
void upgrade_legacy_keys(toml::table& root, const std::string& origin) {
  toml::table* train = root.get("train") ? root.get("train")->as_table() : nullptr;
  if (!train || !train->get("mup")) return;
  const toml::node& old = *train->get("mup");
  if (!old.is_boolean()) fail(origin, "train.mup", std::string("expected true or false, got ") + type_name(old));
  const std::string param = old.as_boolean()->get() ? "mup" : "sp";
  if (const toml::node* p = train->get("param"); p && (!p->is_string() || p->as_string()->get() != param))
    fail(origin, "train.mup", "the old form of train.param; both are given and disagree");
  train->erase("mup");
  train->insert_or_assign("param", param);
}

}  // namespace

TrainConfig parse_train_config(const std::string& text, const std::string& origin, const std::string& size,
                               const std::vector<std::string>& sets) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "config '" << origin << "': not valid TOML at line " << e.source().begin.line << ", column "
       << e.source().begin.column << ": " << e.description();
    throw Error(os.str());
  }
  // Sizes: merged over the root, then removed.
  toml::table sizes;
  if (auto* s = root.get("sizes")) {
    if (!s->is_table()) fail(origin, "sizes", std::string("expected a table of sizes, got ") + type_name(*s));
    sizes = *s->as_table();
    root.erase("sizes");
  }
  if (!size.empty()) {
    auto* s = sizes.get(size);
    if (!s || !s->is_table()) {
      std::string names;
      for (const auto& [k, v] : sizes) names += (names.empty() ? "" : ", ") + std::string(k.str());
      throw Error("config '" + origin + "': size '" + size + "': not in the file (its sizes: " +
                  (names.empty() ? "none" : names) + ")");
    }
    merge_into(root, *s->as_table());
  }
  for (const auto& set : sets) apply_set(root, set, origin);

  upgrade_legacy_keys(root, origin);
  TrainConfig c;
  c.size = size;
  auto fs = fields(c);
  std::map<std::string, const Field*> by_key;
  for (const auto& f : fs) by_key[f.key] = &f;
  std::vector<std::pair<std::string, const toml::node*>> given;
  leaves(root, "", given);
  for (const auto& [key, node] : given) {
    if (node->is_table() && (key == "model" || key == "data" || key == "train")) continue;  // an empty section
    auto it = by_key.find(key);
    if (it == by_key.end()) fail(origin, key, "unknown key (" + known_keys_of(fs, key) + ")");
    assign(*it->second, *node, origin);
  }
  // Every key has a default but the task: a config without one (an empty file) is a mistake, not
  // a request for a default run. (After the unknown keys: a misspelt section is the better message.)
  if (!root.get("task"))
    fail(origin, "task", "missing: a run config names its task (\"charlm\" | \"icr\" | \"ett\"); the file has " +
                             std::to_string(root.size()) + " top-level keys");
  for (const auto& f : fs) {
    if (!f.check) continue;
    const std::string why = f.check(c);
    if (why.empty()) continue;
    std::ostringstream got;
    std::visit([&](auto* p) { got << *p; }, f.ptr);
    fail(origin, f.key, "expected " + why + ", got " + got.str());
  }
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::string& size, const std::vector<std::string>& sets) {
  const std::string where = "config '" + path + "'";
  return parse_train_config(data::read_file(path, where.c_str()), path, size, sets);
}

std::string to_toml(const TrainConfig& c0) {
  TrainConfig c = c0;
  toml::table root;
  for (const auto& f : fields(c)) {
    toml::table* t = &root;
    std::string key = f.key;
    if (const auto dot = key.find('.'); dot != std::string::npos) {
      const std::string section = key.substr(0, dot);
      if (!root.get(section)) root.insert_or_assign(section, toml::table{});
      t = root.get(section)->as_table();
      key = key.substr(dot + 1);
    }
    std::visit([&](auto* p) { t->insert_or_assign(key, *p); }, f.ptr);
  }
  std::ostringstream os;
  os << "# resolved config (size '" << c.size << "')\n" << root << "\n";
  return os.str();
}

bool operator==(const TrainConfig& a0, const TrainConfig& b0) {
  TrainConfig a = a0, b = b0;
  auto fa = fields(a), fb = fields(b);
  for (size_t i = 0; i < fa.size(); ++i) {
    const bool same = std::visit(
        [&](auto* p) { return *p == *std::get<std::remove_cvref_t<decltype(p)>>(fb[i].ptr); }, fa[i].ptr);
    if (!same) return false;
  }
  return true;
}

}  // namespace strata::models
