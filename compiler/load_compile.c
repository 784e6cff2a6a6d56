// load_compile.c: a Keras model's compile_config -> Model's losses (one per
// output, with their weights and options), metrics and optimizer (with its
// learning-rate schedule and clipping). Names resolve as keras.losses.get,
// keras.metrics.get and keras.optimizers.get do; an option Keras would
// take but kdcc does not compute is an error at its value, a metric kdcc
// does not compute a warning (it changes no weight). load.c calls
// load_compile once the model's outputs are known, so that a list or a
// dict of losses can be matched to them. compile_config absent means loss
// "mse" and optimizer "adam", silently; optimizer fields left unset take
// Keras 3's defaults.
#include "kdcc.h"

#include <float.h>
#include <math.h>
#include <string.h>
#include <strings.h>

typedef struct {
  const char *name;
  LossKind kind;
} LossName;

// The names keras.losses.get resolves (keras/src/losses/__init__.py's
// ALL_OBJECTS_DICT): each function's name, its class's, and the aliases.
static const LossName loss_names[] = {
  {"mse", LOSS_MSE}, {"MSE", LOSS_MSE}, {"mean_squared_error", LOSS_MSE},
  {"MeanSquaredError", LOSS_MSE},
  {"mae", LOSS_MAE}, {"MAE", LOSS_MAE}, {"mean_absolute_error", LOSS_MAE},
  {"MeanAbsoluteError", LOSS_MAE},
  {"categorical_crossentropy", LOSS_CCE}, {"CategoricalCrossentropy", LOSS_CCE},
  {"sparse_categorical_crossentropy", LOSS_SCCE}, {"SparseCategoricalCrossentropy", LOSS_SCCE},
  {"binary_crossentropy", LOSS_BCE}, {"BinaryCrossentropy", LOSS_BCE}, {"bce", LOSS_BCE},
  {"BCE", LOSS_BCE},
  // issue 11
  {"huber", LOSS_HUBER}, {"Huber", LOSS_HUBER},
  {"log_cosh", KDRT_LOSS_LOG_COSH}, {"LogCosh", KDRT_LOSS_LOG_COSH},
  {"kl_divergence", LOSS_KLD}, {"KLDivergence", LOSS_KLD}, {"kld", LOSS_KLD},
  {"KLD", LOSS_KLD},
  {"poisson", KDRT_LOSS_POISSON}, {"Poisson", KDRT_LOSS_POISSON},
  {"cosine_similarity", LOSS_COSINE}, {"CosineSimilarity", LOSS_COSINE},
  {"hinge", LOSS_HINGE}, {"Hinge", LOSS_HINGE},
  {"squared_hinge", LOSS_SQUARED_HINGE}, {"SquaredHinge", LOSS_SQUARED_HINGE},
  {"categorical_hinge", LOSS_CAT_HINGE}, {"CategoricalHinge", LOSS_CAT_HINGE},
  {"mean_absolute_percentage_error", KDRT_LOSS_MAPE}, {"MeanAbsolutePercentageError",
  KDRT_LOSS_MAPE}, {"mape", KDRT_LOSS_MAPE}, {"MAPE", KDRT_LOSS_MAPE},
  {"mean_squared_logarithmic_error", KDRT_LOSS_MSLE}, {"MeanSquaredLogarithmicError",
  KDRT_LOSS_MSLE}, {"msle", KDRT_LOSS_MSLE}, {"MSLE", KDRT_LOSS_MSLE},
};

static LossKind loss_by_name(json_t *at, const char *name) {
  for (size_t i = 0; i < sizeof loss_names / sizeof *loss_names; i++)
    if (!strcmp(name, loss_names[i].name))
      return loss_names[i].kind;
  error_at(jloc(at), "unknown loss '%s' (supported: mse, mae, categorical_crossentropy, "
           "sparse_categorical_crossentropy, binary_crossentropy, huber, log_cosh, "
           "kl_divergence, poisson, cosine_similarity, hinge, squared_hinge, categorical_hinge, "
           "mean_absolute_percentage_error, mean_squared_logarithmic_error)", name);
}

// A number option of loss `cls`'s config, or def where absent; lo and hi
// bound it (inclusive), as `range` says.
static double loss_num(json_t *cfg, const char *cls, const char *key, double def, double lo,
                       double hi, const char *range) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v))
    return def;
  if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
    error_at(jloc(v), "loss '%s': '%s' must be a number %s", cls, key, range);
  return json_number_value(v);
}

// One output's loss: a name, or a loss object (class and config).
static void load_loss1(OutLoss *o, json_t *v) {
  o->has = true;
  o->loc = jloc(v);
  if (json_is_string(v)) {
    o->kind = loss_by_name(v, json_string_value(v));
    o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f; // Keras's default delta
    return;
  }
  const char *cls = json_get_str(v, "class_name");
  if (!json_is_object(v) || !cls)
    error_at(jloc(v), "a loss must be a loss name or a loss object");
  json_t *cfg = json_object_get(v, "config");
  if (!strcmp(cls, "function")) { // a serialised loss function: config is its name
    if (!json_is_string(cfg))
      error_at(jloc_key(v, "config"), "loss function without a name");
    o->kind = loss_by_name(cfg, json_string_value(cfg));
    o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f;
    return;
  }
  o->kind = loss_by_name(json_object_get(v, "class_name"), cls);
  o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f;
  if (!json_is_object(cfg))
    return;
  json_t *fl = json_object_get(cfg, "from_logits");
  if (fl && !json_is_null(fl)) {
    if (!json_is_boolean(fl))
      error_at(jloc(fl), "loss '%s': 'from_logits' must be true or false", cls);
    o->from_logits = json_is_true(fl);
    if (o->from_logits && o->kind != LOSS_CCE && o->kind != LOSS_SCCE && o->kind != LOSS_BCE)
      error_at(jloc(fl), "loss '%s': 'from_logits' is not supported", cls);
  }
  // issue 11: the options Keras's loss classes take (their defaults when
  // absent; Keras 3.15 writes none of Huber's delta and CosineSimilarity's
  // axis, but its from_config reads them)
  if (o->kind == LOSS_HUBER)
    o->param = (float)loss_num(cfg, cls, "delta", 1.0, -FLT_MAX, FLT_MAX,
                               "within float32's range");
  else if (json_object_get(cfg, "delta"))
    error_at(jloc_key(cfg, "delta"), "loss '%s': 'delta' is not supported", cls);
  o->label_smoothing = loss_num(cfg, cls, "label_smoothing", 0, 0, 1, "in [0, 1]");
  if (o->label_smoothing != 0 && o->kind != LOSS_CCE && o->kind != LOSS_BCE)
    error_at(jloc_key(cfg, "label_smoothing"), "loss '%s': label_smoothing is not supported",
             cls);
  json_t *ax = json_object_get(cfg, "axis");
  if (ax && !json_is_null(ax) && !json_is_integer(ax))
    error_at(jloc(ax), "loss '%s': 'axis' must be an integer", cls);
  if (json_is_integer(ax)) { // checked against the output's rank (loss.c); MAX_RANK 6
    o->axis = (int)loss_num(cfg, cls, "axis", -1, -MAX_RANK, MAX_RANK - 1, "from -6 to 5");
    o->axis_loc = jloc(ax);
  }
  json_t *ic = json_object_get(cfg, "ignore_class");
  if (ic && !json_is_null(ic))
    error_at(jloc(ic), "loss '%s': ignore_class is not supported", cls);
  const char *red = json_get_str(cfg, "reduction");
  if (red && strcmp(red, "sum_over_batch_size") && strcmp(red, "auto"))
    error_at(jloc_key(cfg, "reduction"), "loss '%s': reduction '%s' is not supported (only "
             "sum_over_batch_size)", cls, red);
}

// The output a dict key names, or an error at the key.
static int output_by_name(Model *m, json_t *obj, const char *key, const char *what) {
  for (int i = 0; i < m->noutputs; i++)
    if (!strcmp(m->outputs[i].layer->name, key))
      return i;
  char *names = xstrdup("");
  for (int i = 0; i < m->noutputs; i++)
    names = format("%s%s'%s'", names, i ? ", " : "", m->outputs[i].layer->name);
  error_at(jloc_keyname(obj, key), "'%s' names '%s', which is not an output of model '%s' "
           "(outputs: %s)", what, key, m->name, names);
}

// `loss`: one loss for every output, a list (one per output, in order) or
// a dict keyed by output name (outputs without a key have no loss).
static void load_loss(Model *m, json_t *v) {
  if (json_is_array(v)) {
    if ((int)json_array_size(v) != m->noutputs)
      error_at(jloc(v), "'loss' lists %zu losses, but model '%s' has %d output%s",
               json_array_size(v), m->name, m->noutputs, m->noutputs == 1 ? "" : "s");
    for (int i = 0; i < m->noutputs; i++) {
      json_t *e = json_array_get(v, i);
      if (!json_is_null(e)) load_loss1(&m->losses[i], e);
    }
  } else if (json_is_object(v) && !json_object_get(v, "class_name")) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) {
      int i = output_by_name(m, v, key, "loss");
      if (!json_is_null(e)) load_loss1(&m->losses[i], e);
    }
  } else {
    for (int i = 0; i < m->noutputs; i++) load_loss1(&m->losses[i], v);
  }
}

static double weight_num(json_t *e) {
  if (!json_is_number(e) || json_number_value(e) < 0 || json_number_value(e) > FLT_MAX)
    error_at(jloc(e), "a loss weight must be a number >= 0 (and within float32's range)");
  return json_number_value(e);
}

// `loss_weights`: a list (per output) or a dict keyed by output name.
static void load_loss_weights(Model *m, json_t *v) {
  if (json_is_array(v)) {
    if ((int)json_array_size(v) != m->noutputs)
      error_at(jloc(v), "'loss_weights' lists %zu weights, but model '%s' has %d output%s",
               json_array_size(v), m->name, m->noutputs, m->noutputs == 1 ? "" : "s");
    for (int i = 0; i < m->noutputs; i++) m->losses[i].weight = weight_num(json_array_get(v, i));
  } else if (json_is_object(v)) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) m->losses[output_by_name(m, v, key, "loss_weights")].weight =
        weight_num(e);
  } else if (json_is_number(v) && m->noutputs == 1) {
    m->losses[0].weight = weight_num(v);
  } else {
    error_at(jloc(v), "'loss_weights' must be a list or a dict keyed by output name");
  }
}

typedef struct {
  const char *cls, *name;
  OptKind kind;
  float lr;               // Keras 3's default learning rate
} OptName;

static const OptName opt_names[] = {
  {"SGD", "sgd", OPT_SGD, 0.01f}, {"Adam", "adam", OPT_ADAM, 0.001f},
  {"AdamW", "adamw", OPT_ADAMW, 0.001f}, {"RMSprop", "rmsprop", OPT_RMSPROP, 0.001f},
  {"Adagrad", "adagrad", OPT_ADAGRAD, 0.001f}, {"Adamax", "adamax", OPT_ADAMAX, 0.001f},
  {"Nadam", "nadam", OPT_NADAM, 0.001f}, {"Lion", "lion", OPT_LION, 0.001f},
};

// A number of an optimizer's (what = "optimizer 'adam'") or a schedule's
// config; absent or null: def.
static double opt_num(const char *what, json_t *cfg, const char *key, double def) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v))
    return def;
  if (!json_is_number(v))
    error_at(jloc(v), "%s: '%s' must be a number", what, key);
  if (fabs(json_number_value(v)) > FLT_MAX)
    error_at(jloc(v), "%s: '%s' is %g, beyond float32's range", what, key, json_number_value(v));
  return json_number_value(v);
}

static bool opt_flag(const char *what, json_t *cfg, const char *key) {
  json_t *v = json_object_get(cfg, key);
  if (v && !json_is_null(v) && !json_is_boolean(v))
    error_at(jloc(v), "%s: '%s' must be true or false", what, key);
  return json_is_true(v);
}

// The numbers of a PiecewiseConstantDecay list, into out[max].
static int opt_list(const char *what, json_t *cfg, const char *key, double *out, int max) {
  json_t *v = json_object_get(cfg, key);
  if (!json_is_array(v))
    error_at(v ? jloc(v) : jloc(cfg), "%s: '%s' must be a list of numbers", what, key);
  if ((int)json_array_size(v) > max)
    error_at(jloc(v), "%s: '%s' has %zu entries; kdcc takes at most %d", what, key,
             json_array_size(v), max);
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_number(e) || fabs(json_number_value(e)) > FLT_MAX)
      error_at(jloc(e), "%s: '%s' must be a list of numbers (within float32's range)", what, key);
    out[i] = json_number_value(e);
  }
  return (int)json_array_size(v);
}

const char *schedule_class(int kind) {
  static const char *const names[] = {
#define KDRT_X(name, kname) kname,
    KDRT_SCHEDULE_LIST(KDRT_X)
#undef KDRT_X
  };
  return names[kind];
}

// A serialized keras.optimizers.schedules object as the learning rate.
static Schedule *load_schedule(const Optimizer *o, json_t *v) {
  const char *cls = json_get_str(v, "class_name");
  json_t *cfg = json_object_get(v, "config");
  Schedule *s = xcalloc(1, sizeof *s);
  s->kind = -1;
  for (int k = 0; k < KDRT_SCHEDULE_COUNT; k++)
    if (cls && !strcmp(cls, schedule_class(k))) s->kind = k;
  if (s->kind < 0)
    error_at(jloc(cls ? json_object_get(v, "class_name") : v),
             "optimizer '%s': learning-rate schedule '%s' is not supported (supported: "
             "ExponentialDecay, PiecewiseConstantDecay, CosineDecay, InverseTimeDecay, "
             "PolynomialDecay)", o->name, cls ? cls : "?");
  if (!json_is_object(cfg))
    error_at(jloc(v), "optimizer '%s': learning-rate schedule '%s' has no config", o->name, cls);
  char *what = format("optimizer '%s': schedule '%s'", o->name, cls);
  if (s->kind == KDRT_SCHEDULE_PIECEWISE) {
    double b[KDRT_SCHEDULE_MAX_BOUNDS + 1];
    s->nbounds = opt_list(what, cfg, "boundaries", b, KDRT_SCHEDULE_MAX_BOUNDS);
    int nv = opt_list(what, cfg, "values", s->values, KDRT_SCHEDULE_MAX_BOUNDS + 1);
    if (nv != s->nbounds + 1 || !s->nbounds)
      error_at(jloc(json_object_get(cfg, "values")), "%s: %d values for %d boundaries (Keras "
               "wants one more value than boundaries, and at least one boundary)", what, nv,
               s->nbounds);
    // Keras casts the boundaries to the step's integer type
    for (int i = 0; i < s->nbounds; i++) s->bounds[i] = trunc(b[i]);
    return s;
  }
  json_t *init = json_object_get(cfg, "initial_learning_rate");
  if (!init || json_is_null(init))
    error_at(jloc(cfg), "%s: 'initial_learning_rate' is missing", what);
  s->initial = opt_num(what, cfg, "initial_learning_rate", 0);
  s->decay_steps = opt_num(what, cfg, "decay_steps", 0);
  if (!(s->decay_steps > 0)) // Keras refuses it too
    error_at(jloc_key(cfg, "decay_steps"), "%s: 'decay_steps' must be > 0", what);
  s->decay_rate = opt_num(what, cfg, "decay_rate", 0);
  s->staircase = opt_flag(what, cfg, "staircase");
  s->cycle = opt_flag(what, cfg, "cycle");
  s->alpha = opt_num(what, cfg, "alpha", 0);
  s->end = opt_num(what, cfg, "end_learning_rate", 0.0001);
  s->power = opt_num(what, cfg, "power", 1);
  json_t *wt = json_object_get(cfg, "warmup_target");
  s->warmup = wt && !json_is_null(wt);
  s->warmup_target = opt_num(what, cfg, "warmup_target", 0);
  s->warmup_steps = opt_num(what, cfg, "warmup_steps", 0);
  return s;
}

static void load_optimizer(Model *m, json_t *v);

// issue 23: keras.mixed_precision.LossScaleOptimizer as the compile_config
// names it (a model compiled with one): its inner optimizer, initial_scale
// and dynamic_growth_steps (Keras's defaults 2^15 and 2000 where absent;
// keras/src/optimizers/loss_scale_optimizer.py).
static void load_loss_scale_optimizer(Model *m, json_t *v) {
  json_t *cfg = json_object_get(v, "config");
  json_t *inner = json_is_object(cfg) ? json_object_get(cfg, "inner_optimizer") : NULL;
  if (!inner || json_is_null(inner))
    error_at(jloc(json_is_object(cfg) ? cfg : v), "optimizer 'LossScaleOptimizer': no "
             "'inner_optimizer'");
  const char *icls = json_is_string(inner) ? json_string_value(inner)
                                           : json_get_str(inner, "class_name");
  if (icls && !strcmp(icls, "LossScaleOptimizer"))
    error_at(jloc(inner), "optimizer 'LossScaleOptimizer': its inner optimizer is a "
             "LossScaleOptimizer too");
  json_t *dyn = json_object_get(cfg, "dynamic");
  if (dyn && json_is_false(dyn)) // Keras refuses it too
    error_at(jloc(dyn), "optimizer 'LossScaleOptimizer': 'dynamic' false is not supported (Keras "
             "3 only scales dynamically)");
  load_optimizer(m, inner);
  Optimizer *o = &m->opt;
  const char *what = "optimizer 'LossScaleOptimizer'";
  o->loss_scale = opt_num(what, cfg, "initial_scale", 32768.0);
  if (!(o->loss_scale > 0))
    error_at(jloc_key(cfg, "initial_scale"), "%s: 'initial_scale' must be > 0", what);
  json_t *gs = json_object_get(cfg, "dynamic_growth_steps");
  o->growth_steps = 2000;
  if (gs && !json_is_null(gs)) {
    if (!json_is_integer(gs) || json_integer_value(gs) < 1)
      error_at(jloc(gs), "%s: 'dynamic_growth_steps' must be an integer >= 1", what);
    o->growth_steps = json_integer_value(gs);
  }
  o->loss_scale_why = "the compile_config's";
}

static void load_optimizer(Model *m, json_t *v) {
  Optimizer *o = &m->opt;
  o->loc = jloc(v);
  const char *cls = json_is_string(v) ? json_string_value(v) : json_get_str(v, "class_name");
  json_t *at = json_is_string(v) ? v : json_object_get(v, "class_name");
  if (!cls)
    error_at(jloc(v), "'optimizer' must be an optimizer name or an optimizer object");
  if (json_is_object(v) && !strcmp(cls, "LossScaleOptimizer")) {
    load_loss_scale_optimizer(m, v);
    return;
  }
  const OptName *on = NULL;
  for (size_t i = 0; i < sizeof opt_names / sizeof *opt_names; i++)
    if (!strcasecmp(cls, opt_names[i].cls))
      on = &opt_names[i];
  if (!on)
    error_at(jloc(at), "unknown optimizer '%s' (supported: sgd, adam, adamw, rmsprop, adagrad, "
             "adamax, nadam, lion)", cls);
  // Keras 3 defaults.
  *o = (Optimizer){.kind = on->kind, .cls = on->cls, .name = on->name, .loc = o->loc, .lr = on->lr,
                   .beta_1 = 0.9f, .beta_2 = on->kind == OPT_LION ? 0.99f : 0.999f,
                   .epsilon = 1e-7f, .rho = 0.9f, .initial_accumulator_value = 0.1f};
  if (on->kind == OPT_ADAMW)
    o->weight_decay = 0.004f;
  json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  if (!json_is_object(cfg))
    return;
  if (json_get_str(cfg, "name"))
    o->name = json_get_str(cfg, "name");
  char *what = format("optimizer '%s'", o->name);
  json_t *lr = json_object_get(cfg, "learning_rate");
  if (json_is_object(lr)) { // the banner's rate: the schedule's at step 0
    o->schedule = load_schedule(o, lr);
    o->lr = (float)(o->schedule->kind == KDRT_SCHEDULE_PIECEWISE ? o->schedule->values[0]
                                                                 : o->schedule->initial);
  } else
    o->lr = (float)opt_num(what, cfg, "learning_rate", o->lr);
  o->beta_1 = (float)opt_num(what, cfg, "beta_1", o->beta_1);
  o->beta_2 = (float)opt_num(what, cfg, "beta_2", o->beta_2);
  o->epsilon = (float)opt_num(what, cfg, "epsilon", o->epsilon);
  o->weight_decay = (float)opt_num(what, cfg, "weight_decay", o->weight_decay);
  o->momentum = (float)opt_num(what, cfg, "momentum", o->momentum);
  o->rho = (float)opt_num(what, cfg, "rho", o->rho);
  o->initial_accumulator_value =
      (float)opt_num(what, cfg, "initial_accumulator_value", o->initial_accumulator_value);
  // The options of one optimizer only: Keras refuses them on another
  // ("Argument(s) not recognized"), kdcc would ignore them.
  static const struct {
    const char *key;
    unsigned kinds; // bit OPT_*
  } own[] = {
    {"amsgrad", 1u << OPT_ADAM | 1u << OPT_ADAMW}, {"centered", 1u << OPT_RMSPROP},
    {"nesterov", 1u << OPT_SGD}, {"momentum", 1u << OPT_SGD | 1u << OPT_RMSPROP},
    {"rho", 1u << OPT_RMSPROP}, {"initial_accumulator_value", 1u << OPT_ADAGRAD},
    {"beta_1", ~(1u << OPT_SGD | 1u << OPT_RMSPROP | 1u << OPT_ADAGRAD)},
    {"beta_2", ~(1u << OPT_SGD | 1u << OPT_RMSPROP | 1u << OPT_ADAGRAD)},
    {"epsilon", ~(1u << OPT_SGD | 1u << OPT_LION)},
  };
  for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
    json_t *x = json_object_get(cfg, own[i].key);
    if (x && !json_is_null(x) && !((own[i].kinds >> on->kind) & 1))
      error_at(jloc_key(cfg, own[i].key), "optimizer '%s': Keras's %s takes no '%s'", o->name,
               on->cls, own[i].key);
  }
  o->nesterov = opt_flag(what, cfg, "nesterov");
  o->amsgrad = opt_flag(what, cfg, "amsgrad");
  o->centered = opt_flag(what, cfg, "centered");
  // base_optimizer: at most one clipping option; one <= 0 clips nothing.
  static const char *const clips[] = {"clipnorm", "global_clipnorm", "clipvalue"};
  float *clip_of[] = {&o->clipnorm, &o->global_clipnorm, &o->clipvalue};
  const char *first = NULL;
  for (int i = 0; i < 3; i++) {
    json_t *c = json_object_get(cfg, clips[i]);
    if (!c || json_is_null(c)) continue;
    if (first)
      error_at(jloc_key(cfg, clips[i]), "optimizer '%s': '%s' and '%s' are both set (Keras takes "
               "only one of clipnorm, clipvalue and global_clipnorm)", o->name, first, clips[i]);
    first = clips[i];
    *clip_of[i] = fmaxf((float)opt_num(what, cfg, clips[i], 0), 0);
  }
  // Options that would change the arithmetic and that kdcc does not do.
  static const char *unsupported[] = {"gradient_accumulation_steps", "loss_scale_factor",
                                      "use_ema", "decay"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
    json_t *u = json_object_get(cfg, unsupported[i]);
    if (u && !json_is_null(u) && !json_is_false(u) &&
        !(json_is_number(u) && json_number_value(u) == 0))
      error_at(jloc_key(cfg, unsupported[i]), "optimizer '%s': '%s' is not supported", o->name,
               unsupported[i]);
  }
}

// Keras's metrics by the names keras.metrics.get resolves (class names,
// their snake_case, the short aliases): the accuracies, and the losses
// Keras computes as metrics (MeanMetricWrapper of the loss function).
typedef struct {
  const char *name;
  MetricKind kind;
  LossKind loss;
} MetricName;

static const MetricName metric_names[] = {
  {"BinaryAccuracy", MET_BINARY_ACC, 0}, {"binary_accuracy", MET_BINARY_ACC, 0},
  {"CategoricalAccuracy", MET_CAT_ACC, 0}, {"categorical_accuracy", MET_CAT_ACC, 0},
  {"SparseCategoricalAccuracy", MET_SPARSE_ACC, 0}, {"sparse_categorical_accuracy", MET_SPARSE_ACC, 0},
  {"MeanSquaredError", MET_LOSS, LOSS_MSE}, {"mean_squared_error", MET_LOSS, LOSS_MSE},
  {"mse", MET_LOSS, LOSS_MSE}, {"MSE", MET_LOSS, LOSS_MSE},
  {"MeanAbsoluteError", MET_LOSS, LOSS_MAE}, {"mean_absolute_error", MET_LOSS, LOSS_MAE},
  {"mae", MET_LOSS, LOSS_MAE}, {"MAE", MET_LOSS, LOSS_MAE},
  {"MeanAbsolutePercentageError", MET_LOSS, KDRT_LOSS_MAPE},
  {"mean_absolute_percentage_error", MET_LOSS, KDRT_LOSS_MAPE},
  {"mape", MET_LOSS, KDRT_LOSS_MAPE}, {"MAPE", MET_LOSS, KDRT_LOSS_MAPE},
  {"MeanSquaredLogarithmicError", MET_LOSS, KDRT_LOSS_MSLE},
  {"mean_squared_logarithmic_error", MET_LOSS, KDRT_LOSS_MSLE},
  {"msle", MET_LOSS, KDRT_LOSS_MSLE}, {"MSLE", MET_LOSS, KDRT_LOSS_MSLE},
  {"LogCoshError", MET_LOSS, KDRT_LOSS_LOG_COSH}, {"log_cosh_error", MET_LOSS, KDRT_LOSS_LOG_COSH},
  {"KLDivergence", MET_LOSS, LOSS_KLD}, {"kl_divergence", MET_LOSS, LOSS_KLD},
  {"Poisson", MET_LOSS, KDRT_LOSS_POISSON}, {"poisson", MET_LOSS, KDRT_LOSS_POISSON},
  {"Hinge", MET_LOSS, LOSS_HINGE}, {"hinge", MET_LOSS, LOSS_HINGE},
  {"SquaredHinge", MET_LOSS, LOSS_SQUARED_HINGE}, {"squared_hinge", MET_LOSS, LOSS_SQUARED_HINGE},
  {"CategoricalHinge", MET_LOSS, LOSS_CAT_HINGE}, {"categorical_hinge", MET_LOSS, LOSS_CAT_HINGE},
  {"BinaryCrossentropy", MET_LOSS, LOSS_BCE}, {"binary_crossentropy", MET_LOSS, LOSS_BCE},
  {"bce", MET_LOSS, LOSS_BCE}, {"BCE", MET_LOSS, LOSS_BCE},
  {"CategoricalCrossentropy", MET_LOSS, LOSS_CCE},
  {"categorical_crossentropy", MET_LOSS, LOSS_CCE},
  {"SparseCategoricalCrossentropy", MET_LOSS, LOSS_SCCE},
  {"sparse_categorical_crossentropy", MET_LOSS, LOSS_SCCE},
};

// A metric object's option that kdcc computes only at Keras's default.
static void metric_default(json_t *cfg, const char *cls, const char *key, double def) {
  json_t *v = json_object_get(cfg, key);
  if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == def))
    error_at(jloc(v), "metric '%s': '%s' is not supported (only %g)", cls, key, def);
}

// A name given twice, or one another log has, is an error where the logs
// are made (loss.c's build_metric), for all outputs at once.
static void add_metric(OutLoss *o, Metric mt) {
  o->metrics = xgrow(o->metrics, o->nmetrics, &(int){o->nmetrics}, sizeof *o->metrics);
  o->metrics[o->nmetrics++] = mt;
}

// One output's metrics: a name, a metric object or a list of them. A
// string names its log (Keras's compile_utils); an object's log is its
// config's name. Metrics kdcc does not compute are a warning: they change
// no weight, only what is reported.
static void load_metrics1(OutLoss *o, json_t *v) {
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      load_metrics1(o, json_array_get(v, i));
    return;
  }
  if (json_is_null(v)) return;
  const char *s = json_is_string(v) ? json_string_value(v) : json_get_str(v, "class_name");
  json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  Metric mt = {.name = json_is_string(v) ? s : json_get_str(cfg, "name"), .loc = jloc(v)};
  if (json_is_string(v) && (!strcasecmp(s, "accuracy") || !strcasecmp(s, "acc"))) {
    mt.kind = MET_ACCURACY; // resolved by the output's shape and labels (loss.c)
    add_metric(o, mt);
    return;
  }
  const MetricName *mn = NULL;
  for (size_t i = 0; s && i < sizeof metric_names / sizeof *metric_names; i++)
    if (!strcmp(s, metric_names[i].name)) mn = &metric_names[i];
  if (!mn) {
    warn_at(jloc(v), "metric '%s' is ignored (kdcc computes the accuracies and the losses as "
            "metrics)", s ? s : "?");
    return;
  }
  mt.kind = mn->kind;
  mt.loss = mn->loss;
  if (!mt.name) mt.name = s;
  if (json_is_object(cfg)) {
    metric_default(cfg, s, "threshold", 0.5);
    metric_default(cfg, s, "label_smoothing", 0);
    metric_default(cfg, s, "axis", -1);
    json_t *fl = json_object_get(cfg, "from_logits");
    if (fl && !json_is_null(fl) && !json_is_boolean(fl))
      error_at(jloc(fl), "metric '%s': 'from_logits' must be true or false", s);
    mt.from_logits = json_is_true(fl);
  }
  add_metric(o, mt);
}

// `metrics`: for one output, a list; for several, a list of lists (one per
// output) or a dict keyed by output name.
static void load_metrics(Model *m, json_t *v) {
  if (json_is_object(v) && !json_object_get(v, "class_name")) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) load_metrics1(&m->losses[output_by_name(m, v, key, "metrics")], e);
  } else if (m->noutputs > 1 && json_is_array(v) && json_array_size(v) == (size_t)m->noutputs &&
             (json_is_array(json_array_get(v, 0)) || json_is_null(json_array_get(v, 0)))) {
    for (int i = 0; i < m->noutputs; i++) load_metrics1(&m->losses[i], json_array_get(v, i));
  } else if (m->noutputs > 1 && !json_is_null(v) &&
             !(json_is_array(v) && json_array_size(v) == 0)) {
    error_at(jloc(v), "model '%s' has %d outputs: give 'metrics' as a dict keyed by output name "
             "or a list of lists", m->name, m->noutputs);
  } else {
    load_metrics1(&m->losses[0], v);
  }
}

// issue 23: Keras's compile wraps the optimizer in a LossScaleOptimizer
// (initial_scale 2^15, dynamic_growth_steps 2000) when the model's own
// dtype policy is mixed_float16 (trainers/trainer.py: auto_scale_loss and
// self.dtype_policy.name == "mixed_float16"), and the saved compile_config
// keeps the optimizer it was given. The model's policy is the global one
// when it was built, which the saved config does not hold (a Functional's
// has no dtype; Keras's load_model gives it the global policy at load
// time); its layers took that same policy unless given their own. So the
// model is taken to be mixed_float16 when a layer is: the global policy
// set, a layer or two (a float32 output, as Keras's guide has it) set
// otherwise. (A float32 model with only some layers given mixed_float16
// one by one trains without loss scaling in Keras; kdcc scales it.)
static void infer_loss_scale(Model *m) {
  Optimizer *o = &m->opt;
  if (o->loss_scale) return; // the compile_config's own
  for (int i = 0; i < m->nlayers; i++)
    if (m->layers[i]->cdt == KDRT_ROUND_F16 && !m->layers[i]->vdt) { // not float16's
      o->loss_scale = 32768.0;
      o->growth_steps = 2000;
      o->loss_scale_why = format("as compile does for a mixed_float16 model: layer '%s'",
                                 m->layers[i]->name);
      return;
    }
}

void load_compile(Model *m, json_t *cc) {
  m->losses = xcalloc(m->noutputs, sizeof *m->losses);
  for (int i = 0; i < m->noutputs; i++)
    m->losses[i] = (OutLoss){.kind = LOSS_MSE, .weight = 1, .axis = -1};
  load_optimizer(m, json_string("adam"));
  if (!cc || json_is_null(cc)) {
    for (int i = 0; i < m->noutputs; i++) m->losses[i].has = true;
    infer_loss_scale(m);
    return;
  }
  if (!json_is_object(cc))
    error_at(jloc(cc), "'compile_config' must be an object");
  json_t *loss = json_object_get(cc, "loss"), *opt = json_object_get(cc, "optimizer");
  if (loss && !json_is_null(loss))
    load_loss(m, loss);
  else
    for (int i = 0; i < m->noutputs; i++) m->losses[i].has = true;
  json_t *lw = json_object_get(cc, "loss_weights");
  if (lw && !json_is_null(lw))
    load_loss_weights(m, lw);
  if (opt && !json_is_null(opt))
    load_optimizer(m, opt);
  json_t *metrics = json_object_get(cc, "metrics");
  if (metrics)
    load_metrics(m, metrics);
  // weighted_metrics (keras-hub's tasks compile theirs so) are weighted by
  // the sample weights (kdcc --sample-weight); without them, their plain ones
  json_t *weighted = json_object_get(cc, "weighted_metrics");
  if (weighted && !json_is_null(weighted)) {
    int *had = xcalloc(m->noutputs, sizeof *had);
    for (int i = 0; i < m->noutputs; i++) had[i] = m->losses[i].nmetrics;
    load_metrics(m, weighted);
    for (int i = 0; i < m->noutputs; i++)
      for (int k = had[i]; k < m->losses[i].nmetrics; k++) m->losses[i].metrics[k].weighted = true;
    xfree(had);
  }
  bool any = false;
  for (int i = 0; i < m->noutputs; i++) any |= m->losses[i].has;
  if (!any)
    error_at(jloc(loss), "model '%s': no output has a loss", m->name);
  infer_loss_scale(m);
}
