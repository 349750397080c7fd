"""The distributed training step, on its own: forward, loss, the one all-reduce, gradient processing, the update.

`TrainStep(config, strategy, model, ...)` owns what the update changes (the optimizer, the step counter, the
loss scale, the moving average of the weights) and is called as `step(iterator, flags)`: it takes one batch per
replica and returns the step's metrics (from the first local replica; every replica holds the same) and the
batch. It knows nothing of model directories, checkpoints or summaries (`loop.py` does), so a test can run it
on a model and a batch alone.

Per replica: forward and backward (XLA-compiled on request), then ONE all-reduce carrying the gradients, the
batch-norm moving statistics (averaged, so every worker holds the same), the loss, the correct count and the
workers' flags (stop, save). Gradient processing then acts on the global gradient, and the optimizer's
per-variable `update_step` runs in a cross-replica `merge_call` (Keras 3's `apply_gradients` would all-reduce
again and clip per replica). Finiteness of the loss, the gradient and the state after the update is reported.
"""

from __future__ import annotations

import tensorflow as tf

from components.common.model import is_kernel, variable_name
from components.train import optimization
from components.train.config import TrainConfig

INITIAL_LOSS_SCALE = 2.0**15
WHITENING_BIAS = "whitening/bias"  # the airbench models' patch-whitening bias (whitening_bias_epochs)
LOSS_SCALE_GROWTH_STEPS = 2000


def cross_entropy(labels: tf.Tensor, logits: tf.Tensor, num_classes: int, label_smoothing: float) -> tf.Tensor:
    """Per-example softmax cross-entropy, with optional label smoothing."""
    targets = tf.one_hot(labels, num_classes)
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
    return tf.nn.softmax_cross_entropy_with_logits(targets, tf.cast(logits, tf.float32))


def _when(condition, update):
    """Run `update` (which returns True) unconditionally when `condition` is None, else only where it holds."""
    return update() if condition is None else tf.cond(condition, update, lambda: tf.constant(True))


class TrainStep:
    def __init__(
        self, config: TrainConfig, strategy, model, num_classes: int, steps_per_epoch: float, total_steps: int
    ):
        self.config, self.strategy, self.model, self.num_classes = config, strategy, model, num_classes
        with strategy.scope():
            self.trained, _frozen = optimization.select_trainable(
                model.trainable_variables, config.trainable, config.frozen
            )
            muon = config.optimizer == "muon"
            self.muon = {  # each kernel's momentum under Muon
                variable_name(variable): self._slot(variable, "muon", tf.zeros_like(variable.value))
                for variable in self.trained
                if muon and optimization.is_muon_variable(variable)
            }
            self.optimizer = optimization.make_optimizer(config)  # every other trained variable's
            self.optimizer.build([variable for variable in self.trained if variable_name(variable) not in self.muon])
            self.step = tf.Variable(
                0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA, name="step"
            )
            self.loss_scale = tf.Variable(
                INITIAL_LOSS_SCALE if config.precision == "mixed_float16" else 1.0,
                trainable=False,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                name="loss_scale",
            )
            self.finite_steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
            )
            self.lookahead = {}
            self.lookahead_started = tf.Variable(
                False, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA, name="lookahead_started"
            )
            if config.lookahead_every_steps:
                for variable in self.lookahead_variables(model, self.trained):
                    self.lookahead[variable_name(variable)] = self._slot(variable, "lookahead", variable.value)
            self.ema = {}
            if config.ema_decay:
                for variable in self.trained:
                    self.ema[variable_name(variable)] = self._slot(variable, "ema", variable.value)
        self.decayed = {
            variable_name(variable)
            for variable in self.trained
            if variable_name(variable) not in self.muon and (is_kernel(variable) or config.weight_decay_biases)
        }
        self.whitening_bias_steps = (config.whitening_bias_epochs or 0.0) * steps_per_epoch
        self.whitening_bias_stops = bool(self.whitening_bias_steps) and any(
            variable_name(variable) == WHITENING_BIAS for variable in self.trained
        )
        self.moving_statistics = list(model.non_trainable_variables)
        self.processing = optimization.GradientProcessing.for_variables(config, self.trained)
        self.schedule = optimization.make_schedule(config, steps_per_epoch, total_steps)
        self.total_steps = total_steps
        self.lookahead_start_step = config.lookahead_start_epochs * steps_per_epoch
        self._compute = tf.function(self._forward_backward, jit_compile=True) if config.xla else self._forward_backward
        self._function = tf.function(self._step_function)

    def __call__(self, iterator, stop_requested: bool = False, save_due: bool = False, stopped_early: bool = False):
        """One step on the next batch: (metrics, batch). This worker's wishes to stop (a signal), to save (its clock)
        and whether its stop is Katib's early stopping are shared with every worker: `stop_agreed`, `save_agreed` and
        `stopped_early` are true on all when any wished it."""
        flags = tf.constant([int(stop_requested), int(save_due), int(stopped_early)])  # cast on each replica
        return self._function(iterator, flags, self.whitening_bias_stopped())

    def whitening_bias_stopped(self) -> bool:
        """Whether the whitening bias has had its `whitening_bias_epochs` (so the step need not compute its gradient:
        that gradient is the backward pass through the first convolution's input, the whitening's GELU and the
        whitening itself). Read from the step counter, the same on every worker, so all take the same step."""
        return self.whitening_bias_stops and int(self.step.numpy()) >= self.whitening_bias_steps

    def _forward_backward(self, images, labels, whitening_bias_stopped: bool = False):
        """Loss, cross-entropy sum, correct count and gradients of this replica (XLA-compiled on request); once the
        whitening bias has stopped, its gradient is zero, not computed."""
        config = self.config
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_example = cross_entropy(labels, logits, self.num_classes, config.label_smoothing)
            loss = tf.reduce_sum(per_example) / config.batch_size
            scaled = loss * self.loss_scale

        def computed(variable) -> bool:
            return not (whitening_bias_stopped and variable_name(variable) == WHITENING_BIAS)

        sources = [variable for variable in self.trained if computed(variable)]
        found = iter(tape.gradient(scaled, sources))
        gradients = [next(found) if computed(variable) else tf.zeros_like(variable.value) for variable in self.trained]
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32))
        return loss, tf.reduce_sum(per_example), correct, gradients

    def _replica_step(self, batch, local_flags, whitening_bias_stopped: bool = False):
        config = self.config
        images, labels = batch
        context = tf.distribute.get_replica_context()
        loss, cross_entropy_total, correct, gradients = self._compute(images, labels, whitening_bias_stopped)
        # Batch-norm moving statistics were just updated from this replica's batch; averaging them across
        # replicas makes every worker hold the update of the averaged batch statistics, as shared variables did.
        statistics = [tf.cast(tf.identity(variable.value), tf.float32) for variable in self.moving_statistics]
        summed = context.all_reduce(
            tf.distribute.ReduceOp.SUM,
            [tf.cast(gradient, tf.float32) for gradient in gradients]
            + statistics
            + [loss, cross_entropy_total, correct, tf.cast(local_flags, tf.float32)],
        )
        count = len(gradients)
        gradients = [gradient / self.loss_scale for gradient in summed[:count]]
        replicas = float(self.strategy.num_replicas_in_sync)
        statistics = [total / replicas for total in summed[count : count + len(statistics)]]
        total_loss, cross_entropy_sum, correct_sum, flags = summed[count + len(statistics) :]
        gradients_finite = optimization.all_finite(gradients)
        loss_finite = tf.math.is_finite(total_loss)
        processed, gradient_norm = self.processing(gradients)
        processed, total_loss = self._weight_decay(processed, total_loss)
        rate = self.schedule(self.step)
        apply = gradients_finite & loss_finite
        context.merge_call(self._apply, args=(processed, rate, apply, gradients_finite, statistics))
        # The state after the update, as a checkpoint would hold it: a finite loss and gradient can still make
        # Inf weights or batch-norm variances (a huge learning rate). Every worker holds the same state.
        state = [tf.cast(variable.value, tf.float32) for variable in self.model.variables]
        state += [tf.cast(shadow, tf.float32) for shadow in self.ema.values()]
        return {
            "state_finite": optimization.all_finite(state),
            "loss": total_loss,
            "cross_entropy": cross_entropy_sum / config.batch_size,
            "accuracy": correct_sum / config.batch_size,
            "gradient_norm": gradient_norm,
            "learning_rate": rate,
            "loss_finite": loss_finite,
            "gradients_finite": gradients_finite,
            "stop_agreed": flags[0] > 0,
            "save_agreed": flags[1] > 0,
            "stopped_early": flags[2] > 0,
            "loss_scale": self.loss_scale.read_value() * 1.0,
        }

    def _weight_decay(self, gradients: list, loss):
        """L2 on the decayed variables, added to the gradients after multipliers and clipping (so that a variable's
        multiplier changes its rate, not its decay) and to the reported loss. adamw decays in the update instead."""
        decay = self.config.weight_decay
        if not decay or self.config.optimizer == "adamw" or not self.decayed:
            return gradients, loss
        decayed = []
        for gradient, variable in zip(gradients, self.trained, strict=True):
            if variable_name(variable) in self.decayed:
                gradient = gradient + decay * tf.cast(variable, tf.float32)
            decayed.append(gradient)
        values = [tf.cast(variable, tf.float32) for variable in self.trained if variable_name(variable) in self.decayed]
        return decayed, loss + decay * tf.add_n([tf.nn.l2_loss(value) for value in values])

    def _apply(self, strategy, gradients, rate, apply, gradients_finite, statistics):
        """Cross-replica: the update, on each replica's copy of the variables (every replica gets the same)."""
        skip_allowed = self.config.precision == "mixed_float16"  # an fp16 overflow skips the step, lowers the scale
        self._set_moving_statistics(strategy, statistics)
        self._update_weights(strategy, gradients, rate, apply if skip_allowed else None)
        self.optimizer.iterations.assign_add(1)
        self.step.assign_add(1)
        if skip_allowed:
            self._adjust_loss_scale(gradients_finite)
        if self.lookahead:
            self._lookahead(strategy)
        if self.ema:
            self._moving_average(strategy)

    def _set_moving_statistics(self, strategy, statistics) -> None:
        """Batch norm's moving statistics become their average over the replicas."""
        for variable, value in zip(self.moving_statistics, statistics, strict=True):
            strategy.extended.update(
                variable.value, lambda held, new: held.assign(tf.cast(new, held.dtype)), args=(value,), group=False
            )

    def _update_weights(self, strategy, gradients, rate, allowed) -> None:
        """Each trained variable moved by its optimizer (Muon for the convolution kernels under muon), at its rate;
        not at all where `allowed` is false (an fp16 overflow) or the variable's training has ended."""
        decoupled = self.config.optimizer == "adamw" and bool(self.config.weight_decay)

        def update(variable, gradient, decoupled_decay, name):
            variable_rate, active = self._rate_of(name, rate)
            condition = allowed if active is None else active if allowed is None else allowed & active
            return _when(condition, lambda: self._update_variable(variable, gradient, variable_rate, decoupled_decay))

        for gradient, variable in zip(gradients, self.trained, strict=True):
            name = variable_name(variable)
            if name in self.muon:
                self._muon_update(strategy, variable, gradient, rate, allowed)
            else:
                arguments = (gradient, decoupled and is_kernel(variable), name)
                strategy.extended.update(variable.value, update, args=arguments, group=False)

    def _adjust_loss_scale(self, gradients_finite) -> None:
        """Dynamic loss scaling: halve on an overflow, double after a run of finite steps."""
        zero = tf.zeros([], tf.int64)
        streak = tf.where(gradients_finite, self.finite_steps + 1, zero)
        grow = streak >= LOSS_SCALE_GROWTH_STEPS
        kept_or_grown = tf.where(grow, self.loss_scale * 2.0, self.loss_scale)
        self.loss_scale.assign(tf.where(gradients_finite, kept_or_grown, tf.maximum(self.loss_scale / 2.0, 1.0)))
        self.finite_steps.assign(tf.where(grow, zero, streak))

    def _moving_average(self, strategy) -> None:
        """The exponential moving average of the trained weights (ema_decay)."""
        decay = self.config.ema_decay
        for variable in self.trained:
            shadow = self.ema[variable_name(variable)]
            strategy.extended.update(
                shadow, lambda held, value: held.assign(decay * held + (1.0 - decay) * value), args=(variable.value,),
                group=False,
            )  # fmt: skip

    @staticmethod
    def _slot(variable, purpose: str, initial) -> tf.Variable:
        """A variable beside `variable`, starting at `initial`, for state the update keeps (Muon's momentum, the
        lookahead and moving-average shadows; checkpointed with it)."""
        return tf.Variable(initial, trainable=False, name=f"{purpose}_{variable_name(variable)}".replace("/", "_"))

    def _rate_of(self, name: str, rate):
        """(the rate of variable `name`, and whether it still trains): the scheduled rate, but for the whitening bias
        under `whitening_bias_epochs`, whose rate falls from the base rate to zero over them (then it stops)."""
        if not self.whitening_bias_steps or name != WHITENING_BIAS:
            return rate, None
        progress = tf.cast(self.step, tf.float32) / self.whitening_bias_steps
        return self.schedule.base * tf.maximum(1.0 - progress, 0.0), progress < 1.0

    def _muon_update(self, strategy, variable, gradient, rate, apply) -> None:
        """Muon on one convolution kernel: momentum on the (all-reduced, processed) gradient, then the kernel
        renormalised and moved by the orthogonalised (Nesterov) momentum, at muon's rate on the same schedule."""
        config = self.config
        momentum = config.muon_momentum
        muon_rate = config.muon_learning_rate * rate / self.schedule.base
        buffer = self.muon[variable_name(variable)]

        def step(kernel, held, new_gradient):
            optimization.apply_muon(kernel, held, new_gradient, muon_rate, momentum, config.nesterov,
                                    config.newton_schulz_steps)  # fmt: skip
            return tf.constant(True)

        def guarded(kernel, held, new_gradient):
            return _when(apply, lambda: step(kernel, held, new_gradient))

        strategy.extended.update(variable.value, guarded, args=(buffer, gradient), group=False)

    @staticmethod
    def lookahead_variables(model, trained) -> list:
        """What lookahead averages: the trained weights and batch norm's moving statistics (as airbench's state)."""
        statistics = [variable for variable in model.non_trainable_variables if "moving_" in variable_name(variable)]
        return list(trained) + statistics

    def _lookahead(self, strategy) -> None:
        """airbench's lookahead: every `lookahead_every_steps` steps from `lookahead_start_epochs` on, the shadow
        moves toward the weights (decay base^every x progress^power, so it averages harder as training ends) and the
        weights are set to the shadow; the first time, the shadow is the weights; the last step ends on the shadow."""
        config = self.config
        every = config.lookahead_every_steps
        step = tf.cast(self.step, tf.float32)
        due = tf.logical_and(tf.equal(self.step % every, 0), step >= self.lookahead_start_step)
        finishing = tf.logical_and(self.lookahead_started, self.step >= self.total_steps)
        progress = step / float(max(1, self.total_steps))
        rho = tf.where(
            self.lookahead_started, config.lookahead_decay**every * progress**config.lookahead_decay_power, 0.0
        )
        model = self.model
        for variable in self.lookahead_variables(model, self.trained):
            shadow = self.lookahead[variable_name(variable)]
            strategy.extended.update(
                shadow,
                lambda held, value: held.assign(
                    tf.where(due, rho * held + (1.0 - rho) * tf.cast(value, held.dtype), held)
                ),
                args=(variable.value,),
                group=False,
            )
            strategy.extended.update(
                variable.value,
                lambda held, value: held.assign(tf.where(due | finishing, tf.cast(value, held.dtype), held)),
                args=(shadow,),
                group=False,
            )
        self.lookahead_started.assign(self.lookahead_started | due)

    def _update_variable(self, variable, gradient, rate, decoupled_decay: bool):
        gradient = tf.cast(gradient, variable.dtype)
        if decoupled_decay:  # AdamW: weight decay applied to the weights, not through the gradient
            variable.assign_sub(variable * tf.cast(self.config.weight_decay * rate, variable.dtype))
        self.optimizer.update_step(gradient, variable, tf.cast(rate, variable.dtype))
        return tf.constant(True)

    def _step_function(self, iterator, local_flags, whitening_bias_stopped: bool = False):
        batch = next(iterator)
        outputs = self.strategy.run(self._replica_step, args=(batch, local_flags, whitening_bias_stopped))
        return {key: self.strategy.experimental_local_results(value)[0] for key, value in outputs.items()}, batch
